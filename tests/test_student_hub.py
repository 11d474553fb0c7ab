"""The student from the Hub (trainer_core/student_hub.py) through `gguf-trainer download` in this process: the
search lists only pig_clip GGUFs, f16 first, with their sizes; `--pick` fetches one (resuming a partial file) and
makes it a ready student the loader takes; a file that is no student is refused and removed; without the Hub, one
sentence at once."""
from __future__ import annotations

import pytest

from conftest import cli_here
from hub_server import LocalHub, go_online
from student_files import student_gguf_bytes
from trainer_core import materials
from trainer_core.base.diskspace import human
from trainer_core.packs.lookup import find_material, resolve_material
from trainer_core.project import Project
from trainer_core.readiness import launch_problems

REPO_ID = "someone/pig_clip-GGUF"


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def repos():
    return {REPO_ID: {"pig_clip-q8_0.gguf": student_gguf_bytes("q8_0"), "pig_clip-f16.gguf": student_gguf_bytes(),
                      "pig_t5_adapter-f16.gguf": b"an adapter, not a student" * 50, "README.md": b"# pig_clip"},
            "callgg/pig-clip-tokenizer": {"config.json": b"{}"},                 # found by the search, no GGUF
            "other/pig-clip-broken": {"pig_clip-f16.gguf": student_gguf_bytes()[:20_000]},   # a truncated copy
            "other/qwen3-gguf": {"qwen3-0.6b-f16.gguf": b"not named pig_clip" * 100}}


@pytest.fixture
def hub(repos, monkeypatch):
    with LocalHub(repos) as h:
        go_online(monkeypatch, h.url)
        yield h


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return Project.create(tmp_path / "projects" / "t5_adapter", "t5xxl_pixart")


def _student(project: Project) -> materials.MaterialStatus:
    project = Project.open(project.root)
    return materials.material_status(project, find_material(project.pack, "student"))


def test_find_lists_the_pig_clip_ggufs_and_pick_makes_a_ready_student(hub, project, repos):
    assert _student(project).status == "missing"
    r = cli_here("download", "--project", str(project.root), "--find-student")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.strip()[:1].isdigit()]
    # f16 first; the adapter, the tokenizer repo, the file not named pig_clip are not candidates
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("1", "other/pig-clip-broken", "pig_clip-f16.gguf"), ("2", REPO_ID, "pig_clip-f16.gguf"),
        ("3", REPO_ID, "pig_clip-q8_0.gguf")]
    for row, (repo, name) in zip(rows, [("other/pig-clip-broken", "pig_clip-f16.gguf"), (REPO_ID, "pig_clip-f16.gguf"),
                                        (REPO_ID, "pig_clip-q8_0.gguf")]):
        assert " ".join(row[3:5]) == human(len(repos[repo][name]))         # the size the Hub lists
    assert "q8_0: quantized" in r.stdout and "--pick N" in r.stdout

    # a partial file an interrupted download left behind is continued, not fetched again
    data = repos[REPO_ID]["pig_clip-f16.gguf"]
    partial = project.materials_dir / materials.PARTIAL_DIR / "pig_clip-f16.gguf"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[:50_000])
    hub.clear_requests()
    r = cli_here("download", "--project", str(project.root), "--pick", "2")
    assert r.returncode == 0, r.stderr
    gets = [q for q in hub.requests if q.method == "GET" and q.path.endswith("/resolve/main/pig_clip-f16.gguf")]
    assert [q.headers.get("range") for q in gets] == ["bytes=50000-"]

    target = resolve_material(Project.open(project.root), "student")
    assert target == project.materials_dir / "pig_clip-f16.gguf" and target.read_bytes() == data
    assert not partial.parent.exists()
    st = _student(project)
    assert (st.status, st.bytes_done) == ("ready", len(data))
    assert not [line for line in launch_problems(Project.open(project.root)) if "student" in line]
    from trainer_core.contract.student import read_student_gguf
    from trainer_core.packs.common.tiny_models import tiny_qwen3_config
    weights = read_student_gguf(target, tiny_qwen3_config(vocab_size=512))       # the loader takes it
    assert weights["embed_tokens.weight"].shape == (512, 64)


def test_a_file_that_is_no_student_is_refused_and_removed(hub, project):
    r = cli_here("download", "--project", str(project.root), "--repo", "other/pig-clip-broken",
                 "--file", "pig_clip-f16.gguf")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]           # after the progress lines
    assert last.startswith("other/pig-clip-broken/pig_clip-f16.gguf is not a usable pig_clip student: it is "
                           "truncated") and last.endswith("the file was removed, pick another one.")
    assert not (project.materials_dir / "pig_clip-f16.gguf").exists()
    assert _student(project).status == "missing" and Project.open(project.root).settings.materials == {}


@pytest.mark.parametrize("args, words", [
    (("--pick", "9"), "--pick 9: the search found 3 pig_clip GGUFs; pick 1 to 3"),
    (("--repo", REPO_ID), "--repo needs --file too"),
    (("--pick", "1", "--repo", REPO_ID, "--file", "pig_clip-f16.gguf"), "give one of the two"),
    (("--repo", REPO_ID, "--file", "README.md"), "README.md is not a pig_clip GGUF file name"),
])
def test_a_wrong_choice_is_one_sentence_and_exit_2(hub, project, args, words):
    r = cli_here("download", "--project", str(project.root), *args)
    assert (r.returncode, r.stdout) == (2, "")
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert _student(project).status == "missing"


@pytest.mark.parametrize("hub_state", ["unreachable", "offline mode"])
def test_without_the_hub_the_search_says_so_in_one_sentence(project, monkeypatch, hub_state):
    """No Hub: the one request without retries answers (huggingface_hub's own retries would print a warning per
    try, with back-off); in offline mode not even that."""
    import huggingface_hub.constants as constants
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")          # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", hub_state == "offline mode")
    r = cli_here("download", "--project", str(project.root), "--find-student")
    assert (r.returncode, r.stdout) == (1, "")
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot be reached" in lines[0] and "link a pig_clip-f16.gguf you have" in lines[0]
    assert ("HF_HUB_OFFLINE is set" in lines[0]) == (hub_state == "offline mode")


def test_download_names_the_way_to_the_student(project, monkeypatch):
    """The materials' own download (offline here: its teacher fails to list) tells where the student comes from."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    r = cli_here("download", "--project", str(project.root), "--id", "student")
    assert r.returncode == 0, r.stderr
    assert f"download --project {project.root} --find-student" in r.stdout and "pig_clip 0.6B Qwen3" in r.stdout


def test_another_student_for_a_project_with_shards_is_refused_before_any_download(hub, project):
    shard = project.shards_dir("train") / "train-00000.safetensors"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"made with another student")
    hub.clear_requests()
    r = cli_here("download", "--project", str(project.root), "--repo", REPO_ID, "--file", "pig_clip-f16.gguf")
    assert r.returncode == 2 and "would make this project's work stale" in r.stderr and "--force" in r.stderr
    assert not [q for q in hub.requests if "/resolve/" in q.path] and _student(project).status == "missing"
