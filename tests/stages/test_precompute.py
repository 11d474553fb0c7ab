"""Precompute on the demo project: shard content, stop/resume byte-identity, kill -9, stale contracts."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_core.base.errors import DiskFullError
import torch

from conftest import REPO, copy_project, demo_with_corpus
from trainer_core.contract.corpus_files import read_corpus
from trainer_core.contract.engine_bpe import TOKENIZATION
from trainer_core.demo import build_demo
from trainer_core.base.errors import TrainerError
from trainer_core.base.events import ListReport, parse_event
from trainer_core.project import Project
from trainer_core.contract.shards import Shard, load_stats, shard_files, valid_shards
from trainer_core.stages import corpus, precompute, stage_done
from trainer_core.packs.lookup import format_prompt, resolve_material


@pytest.fixture(scope="module")
def demo_template(tmp_path_factory):
    """A demo project with its corpus written (built once; tests work on copies)."""
    return demo_with_corpus(tmp_path_factory.mktemp("demo") / "t5_adapter")


@pytest.fixture
def demo(demo_template, tmp_path):
    return copy_project(demo_template, tmp_path)


def small_shards(project: Project, size: int = 20) -> Project:
    project.update_settings([f"precompute.shard_size={size}"])
    return project


def shard_bytes(project: Project, split: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in shard_files(project, split)}


def test_shard_content_is_the_contract(demo):
    from trainer_core.packs.common.t5.teacher import T5Teacher
    from trainer_core.contract.student import load_student
    report = ListReport()
    assert precompute.run(demo, report, split="val") == "done"
    (path,) = shard_files(demo, "val")
    shard = Shard(path)
    teacher = T5Teacher(resolve_material(demo, "teacher"))
    student = load_student(resolve_material(demo, "student"), resolve_material(demo, "student_tokenizer"),
                           dtype="bf16")
    prompts = shard.prompts
    val = read_corpus(demo.corpus_files()[1])
    assert sorted(prompts) == sorted(val) and len(shard) == 40
    windows, lens = teacher.seed_windows(prompts)
    assert lens.tolist() == sorted(lens.tolist())                      # sorted by seed length
    assert torch.equal(shard["seed_ids"], windows.to(torch.int32))
    assert torch.equal(shard["seed_len"], lens.to(torch.int32)) and torch.equal(shard["t_len"], shard["seed_len"])
    want_rows = torch.cat([r.to(torch.bfloat16) for r in teacher.real_rows(prompts)])
    assert torch.equal(shard["t_pack"], want_rows)                     # real slots only, packed
    tokens = [student.tokenize(p) for p in prompts]                    # raw prompt, no template
    assert shard["len"].tolist() == [len(t) for t in tokens]
    assert shard["ids"].tolist() == [i for t in tokens for i in t]
    for k, (text, start) in enumerate(zip(prompts, [0] + torch.cumsum(shard["len"], 0).tolist()[:-1])):
        alone, _ = student.encode([text])
        rows = shard["q_pack"][start:start + len(tokens[k])].float()
        # bf16 compute: a batched row may differ from the prompt run alone by bf16 rounding
        torch.testing.assert_close(rows, alone[0], atol=0.05, rtol=0.05)
        assert torch.nn.functional.cosine_similarity(rows, alone[0], dim=-1).min() > 0.999
    t64 = shard["t_pack"].double()
    torch.testing.assert_close(shard["stat_s"], t64.sum(0))
    torch.testing.assert_close(shard["stat_s2"], (t64 * t64).sum(0))
    assert shard["stat_n"].tolist() == [t64.shape[0]]
    assert shard.meta["contract"] == f"t5xxl_pixart/1 {TOKENIZATION}" and shard.meta["mock_teacher"] is False
    assert (shard.meta["in_dim"], shard.meta["out_dim"]) == (64, teacher.out_dim)
    assert (demo.shards_dir("val") / "CONTRACT").read_text() == f"t5xxl_pixart/1 {TOKENIZATION}\n"
    progress = report.of_type("progress")
    assert progress[-1]["count"] == progress[-1]["total"] == 1 and progress[-1]["eta_s"] == 0


def test_statistics_come_from_the_train_shards(demo):
    small_shards(demo, 100)
    assert precompute.run(demo, ListReport(), split="train") == "done"
    rows = torch.cat([Shard(p)["t_pack"].double() for p in shard_files(demo, "train")])
    floor = 0.03
    mu, sigma, floored = load_stats(demo, floor)
    torch.testing.assert_close(mu, rows.mean(0).float())
    want_sigma = rows.std(0, unbiased=False).clamp_min(floor).float()
    torch.testing.assert_close(sigma, want_sigma, rtol=1e-4, atol=1e-6)
    assert floored == int((rows.std(0, unbiased=False) < floor).sum())


def test_stop_after_a_shard_then_resume_is_byte_identical(demo, tmp_path):
    reference = Project.open(shutil.copytree(demo.root, tmp_path / "reference"))
    small_shards(demo), small_shards(reference)
    assert precompute.run(reference, ListReport(), split="train") == "done"
    calls = []
    stopped = precompute.run(demo, ListReport(), lambda: calls.append(1) or len(calls) > 2, split="train")
    assert stopped == "stopped" and 0 < len(shard_files(demo, "train")) < len(shard_files(reference, "train"))
    assert not stage_done(demo, "precompute_train")
    report = ListReport()
    assert precompute.run(demo, report, split="train") == "done"
    assert stage_done(demo, "precompute_train")
    assert shard_bytes(demo, "train") == shard_bytes(reference, "train")


def _stage_process(project: Project, split: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "trainer_core.stages.precompute", "--project", str(project.root),
                             "--split", split], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _wait_for_first_shard(proc: subprocess.Popen) -> None:
    for line in proc.stdout:
        event = parse_event(line)
        if event and event["type"] == "artifact":
            return
    raise AssertionError("the stage wrote no shard: " + proc.stderr.read().decode())


def test_sigterm_during_precompute_then_restart_is_byte_identical(demo, tmp_path):
    reference = Project.open(shutil.copytree(demo.root, tmp_path / "reference"))
    small_shards(demo), small_shards(reference)
    assert precompute.run(reference, ListReport(), split="train") == "done"
    total = len(shard_files(reference, "train"))

    proc = _stage_process(demo, "train")
    _wait_for_first_shard(proc)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read().decode()
    assert proc.wait(timeout=120) == 4, proc.stderr.read().decode()          # stopped
    assert "signal 15: finishing the current unit of work" in rest
    assert 0 < len(shard_files(demo, "train")) < total
    assert not list(demo.shards_dir("train").glob(".*.tmp"))

    again = _stage_process(demo, "train")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err.decode()
    assert shard_bytes(demo, "train") == shard_bytes(reference, "train")


def test_kill_9_mid_shard_leaves_no_file_a_reader_would_accept(demo, tmp_path):
    reference = Project.open(shutil.copytree(demo.root, tmp_path / "reference"))
    small_shards(demo, 10), small_shards(reference, 10)
    assert precompute.run(reference, ListReport(), split="train") == "done"
    proc = _stage_process(demo, "train")
    _wait_for_first_shard(proc)
    proc.kill()
    proc.wait(timeout=60)
    finals = shard_files(demo, "train")
    assert 0 < len(finals) < len(shard_files(reference, "train"))
    for path in finals:  # whatever bears a final name is a complete, identical shard
        assert path.read_bytes() == (reference.shards_dir("train") / path.name).read_bytes()
        Shard(path)
    leftovers = [p for p in demo.shards_dir("train").iterdir() if p not in finals and p.name != "CONTRACT"]
    assert all(p.name.startswith(".") and p.name.endswith(".tmp") for p in leftovers)
    assert precompute.run(demo, ListReport(), split="train") == "done"
    assert shard_bytes(demo, "train") == shard_bytes(reference, "train")
    assert sorted(p.name for p in demo.shards_dir("train").iterdir()) == ["CONTRACT", *sorted(shard_bytes(reference, "train"))]


def test_a_crash_while_writing_leaves_no_shard(demo, monkeypatch):
    import safetensors.torch

    def half_write(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"")  # a header cut short
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", half_write)
    with pytest.raises(DiskFullError, match="No space left on .* while writing val-00000.safetensors"):
        precompute.run(demo, ListReport(), split="val")
    assert shard_files(demo, "val") == [] and list(demo.shards_dir("val").iterdir()) == [demo.shards_dir("val") / "CONTRACT"]


def test_a_changed_contract_discards_shards_and_archives_checkpoints(demo):
    assert precompute.run(demo, ListReport(), split="val") == "done"
    (demo.shards_dir("val") / "CONTRACT").write_text("t5xxl_pixart/0\n")
    assert valid_shards(demo, "val") == [] and not stage_done(demo, "precompute_val")
    demo.checkpoints_dir.mkdir()
    (demo.checkpoints_dir / "last.pt").write_bytes(b"weights trained on the old shards")
    report = ListReport()
    assert precompute.run(demo, report, split="val") == "done"
    logs = " | ".join(e["message"] for e in report.of_type("log"))
    assert f'val shards discarded: 1 were written under "t5xxl_pixart/0", this run needs "t5xxl_pixart/1 {TOKENIZATION}"' in logs
    (archived,) = demo.root.glob("checkpoints.stale-*")
    assert (archived / "last.pt").read_bytes() == b"weights trained on the old shards"
    assert not demo.checkpoints_dir.exists() and stage_done(demo, "precompute_val")


def test_switching_to_the_mock_teacher_is_a_contract_change(demo, monkeypatch):
    assert precompute.run(demo, ListReport(), split="val") == "done"
    real = shard_bytes(demo, "val")
    monkeypatch.setenv("GGUF_TRAINER_MOCK_TEACHER", "1")
    demo = Project.open(demo.root)
    assert not stage_done(demo, "precompute_val")
    report = ListReport()
    assert precompute.run(demo, report, split="val") == "done"
    assert any("MOCK teacher" in e["message"] for e in report.of_type("log"))
    (path,) = shard_files(demo, "val")
    shard = Shard(path)
    assert shard.meta["mock_teacher"] is True and shard.meta["contract"] == f"t5xxl_pixart/1 {TOKENIZATION} mock-teacher"
    assert path.read_bytes() != real[path.name]
    monkeypatch.delenv("GGUF_TRAINER_MOCK_TEACHER")
    assert not stage_done(Project.open(demo.root), "precompute_val")   # mocked shards never pass for real ones


def test_a_failing_shard_is_named_and_finished_shards_are_kept(demo, monkeypatch):
    small_shards(demo, 100)
    pack_class = type(demo.pack)
    original = pack_class.make_shard
    calls = []

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, *args, **kwargs)
    monkeypatch.setattr(pack_class, "make_shard", flaky)
    with pytest.raises(TrainerError) as info:
        precompute.run(demo, ListReport(), split="train")
    assert "Out of memory while computing train shard 1" in str(info.value)
    assert "the 1 finished train shard(s) of 4 are kept" in str(info.value)
    assert [p.name for p in shard_files(demo, "train")] == ["train-00000.safetensors"]


def test_missing_student_is_a_clear_error(demo):
    demo.update_settings(["materials.student.path=materials/nowhere.gguf"])
    with pytest.raises(TrainerError, match="nowhere.gguf does not exist"):
        precompute.run(demo, ListReport(), split="val")


def test_demo_is_deterministic(tmp_path):
    a = build_demo(tmp_path / "a" / "t5_adapter")
    b = build_demo(tmp_path / "b" / "t5_adapter")
    for project in (a, b):
        assert corpus.run(project, ListReport()) == "done"

    def tree(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and p.name != "state.json"}
    assert tree(a.root) == tree(b.root)
    assert (a.materials_dir / "pig_clip-demo-f16.gguf").is_file()


def test_demo_then_run_through_precompute(tmp_path, run_cli):
    root = tmp_path / "demo" / "t5_adapter"
    r = run_cli("demo", "--project", str(root), "--pack", "t5xxl_pixart")
    assert r.returncode == 0, r.stderr
    assert f"gguf-trainer run --project {root}" in r.stdout
    # a folder outside the projects root: the demo says where its GGUF goes and how the GUI opens it (issue 56)
    project = Project.open(root)
    assert f"its GGUF will be written to {project.gguf_path()}" in r.stdout
    allow = re.search(r"open it in the GUI: gguf-trainer --allow-dir (\S+) ", r.stdout).group(1)
    from ui.paths import PathPolicy
    policy = PathPolicy([str(tmp_path / "home-projects"), allow])        # the GUI's policy with that --allow-dir
    assert policy.check(str(root), "project folder") == root.resolve()
    assert policy.check(str(project.gguf_path()), "export") == project.gguf_path().resolve()
    r = run_cli("run", "--project", str(root), "--only", "corpus", "precompute_val", "precompute_train", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    status = json.loads(run_cli("status", "--project", str(root), "--json").stdout)
    done = {s["name"]: s["done"] for s in status["stages"]}
    assert done["corpus"] and done["precompute_val"] and done["precompute_train"] and not done["train"]
    assert len(shard_files(Project.open(root), "train")) == 3
    r = run_cli("demo", "--project", str(root))
    assert r.returncode == 2 and f"A project already exists at {root}" in r.stderr
    # the whole pipeline on the demo (train, export, eval) is tests/stages/test_export.py


def test_llada_precompute_on_the_mock_teacher(demo_template, tmp_path):
    """The resampler layout end to end: the LLaDA template for the student, 256 query rows a prompt."""
    from trainer_core.packs.llada_image import EMPTY, NUM_QUERIES, OUT_DIM
    project = Project.create(tmp_path / "llada_adapter", "llada_image")
    materials = demo_template / "materials"
    project.update_settings([
        "precompute.mock_teacher=true", "precompute.device=cpu", "corpus.presets=[]", "corpus.n_val=10",
        f"corpus.extra_files={materials / 'demo_prompts.txt'}",
        f"materials.student.path={materials / 'pig_clip-demo-f16.gguf'}",
        f"materials.student_tokenizer.path={materials / 'pig-clip-tokenizer'}",
    ])
    assert corpus.run(project, ListReport()) == "done"
    assert precompute.run(project, ListReport(), split="val") == "done"
    (path,) = shard_files(project, "val")
    shard = Shard(path)
    assert shard.meta["mock_teacher"] is True and shard.meta["contract"] == f"llada_image/2 {TOKENIZATION} mock-teacher"
    assert shard["t_pack"].shape == (10 * NUM_QUERIES, OUT_DIM) and shard["t_len"].tolist() == [NUM_QUERIES] * 10
    teacher_lens = [len(format_prompt(project.pack, p)) // 4 + 1 for p in shard.prompts]   # the mock's lengths
    assert teacher_lens == sorted(teacher_lens)                  # the shard keeps the teacher batching order
    from trainer_core.contract.student import load_student
    student = load_student(materials / "pig_clip-demo-f16.gguf", materials / "pig-clip-tokenizer")
    for prompt, n in zip(shard.prompts, shard["len"].tolist()):
        text = EMPTY if not prompt else f"<role>HUMAN</role> Generate an image: {prompt}\n<role>ASSISTANT</role>\n<IMAGE1>"
        assert n == len(student.tokenize(text))
    assert "" in shard.prompts  # the val split always holds an empty prompt
