"""What a new user tripped on (issue 40), CLI side: `inspect` describes every file an export writes, the
app on a port in use is one sentence naming --port (exit 2), and `start` / `run` list every missing
material before launching (tests/test_cli_pipeline.py)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

import demo_cache
from conftest import REPO, cli
from trainer_core.packs import DEMO_PACKS
from trainer_core.project import Project


@pytest.mark.parametrize("pack_id", DEMO_PACKS)
def test_inspect_describes_every_file_the_demo_export_wrote(pack_id, tmp_path):
    project = Project.open(demo_cache.copy_trained(pack_id, tmp_path / "p"))
    written = [project.gguf_path(), *(p for p in project.pack.extras.outputs(project) if p.suffix == ".gguf")]
    for path in written:
        assert path.is_file(), path
        r = cli("inspect", str(path))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "unknown GGUF" not in r.stdout and "PROBLEM" not in r.stdout and "layout: OK" in r.stdout


def test_the_extras_are_named_for_what_they_are(tmp_path):
    ming = Project.open(demo_cache.copy_trained("ming_image", tmp_path / "ming"))
    (vision,) = [p for p in ming.pack.extras.outputs(ming) if p.suffix == ".gguf"]
    r = cli("inspect", str(vision))
    assert "vision GGUF" in r.stdout and "Ming-Image input-image encoder" in r.stdout and "layers: " in r.stdout
    llada = Project.open(demo_cache.copy_trained("llada_image", tmp_path / "llada"))
    (sigvq,) = [p for p in llada.pack.extras.outputs(llada) if p.suffix == ".gguf"]
    r = cli("inspect", str(sigvq))
    assert "vision GGUF" in r.stdout and "SigVQ image tokenizer" in r.stdout


def test_a_damaged_extra_is_still_described_with_its_problem(tmp_path):
    """A vision file that lost the engine's projection: named as what it is, with the problem."""
    import gguf
    import numpy as np
    broken = tmp_path / "pig_ming_vision-f16.gguf"
    writer = gguf.GGUFWriter(str(broken), "pig")
    writer.add_string("ming_vision.source", "inclusionAI/Ming-Image-0.1-Design")
    writer.add_tensor("vision.patch_embed.proj.weight", np.zeros((32, 1176), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    r = cli("inspect", str(broken))
    assert r.returncode == 1 and "vision GGUF" in r.stdout and "PROBLEM" in r.stdout and "lacks" in r.stdout


def test_the_app_on_a_port_in_use_is_one_sentence_naming_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "app.py", "--port", str(port), "--no-browser"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stdout + r.stderr and "GRADIO_SERVER_PORT" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"Port {port} on 127.0.0.1 is already in use") and "--port N" in line
    suggested = int(line.split("(--port ")[1].split(" ")[0])
    with socket.socket() as s:                                   # the port it names was free when it said so
        s.bind(("127.0.0.1", suggested))


def test_the_plans_memory_hints_name_the_setting_each_pack_places_its_teacher_with(tmp_path):
    """LLaDA places its teacher with precompute.placement, not teacher_mode: its warnings must say so."""
    from trainer_core.packs import PACKS
    from trainer_core.plan import stream_hint
    for pack in PACKS.values():
        project = Project.create(tmp_path / pack.id, pack.id)
        hint = stream_hint(project)
        assert f"precompute.{pack.teacher_control}" in hint
        if pack.teacher_control != "teacher_mode":
            assert "teacher_mode" not in hint


def test_new_says_what_to_do_next_and_demo_on_an_existing_project_says_so_at_once(tmp_path):
    r = cli("new", "--project", str(tmp_path / "z"), "--pack", "qwen3_zimage")
    assert r.returncode == 0
    todo = [line for line in r.stdout.splitlines() if line.startswith("  to do: ")]
    assert len(todo) == 3 and any("materials.student.path=FILE" in line for line in todo)
    assert f"gguf-trainer start --project {tmp_path / 'z'}" in r.stdout
    before = sorted(p.name for p in (tmp_path / "z").iterdir())
    r = cli("demo", "--pack", "qwen3_zimage", "--project", str(tmp_path / "z"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"A project already exists at {tmp_path / 'z'}; run it with `gguf-trainer run "
                                f"--project {tmp_path / 'z'}`, or delete that folder (or pass another --project) "
                                "to build the demo afresh.")
    assert sorted(p.name for p in (tmp_path / "z").iterdir()) == before
