"""Materials against a local Hub on loopback (tests/hub_server.py, selected with HF_ENDPOINT):
status online and offline, discovery and linking, resumable downloads with Range, the stall
watchdog, one job per material, the disk-space refusal, and the CLI."""
from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO
from hub_server import LocalHub, go_online
from trainer_core import materials
from trainer_core.project import Project
from trainer_core.packs.lookup import find_material, resolve_material

TOKENIZER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "vocab.json", "merges.txt")
TEACHER_FILES = ("config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
                 "spiece.model", "tokenizer_config.json")


def _bytes(name: str, n: int) -> bytes:
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (n // len(seed) + 1))[:n]


@pytest.fixture
def repos():
    tok = {f: _bytes(f, 200 + 10 * i) for i, f in enumerate(TOKENIZER_FILES)}
    tok["README.md"] = b"not selected by the patterns"
    teacher = {f: _bytes("t" + f, 300) for f in TEACHER_FILES}
    teacher["model.safetensors"] = _bytes("weights", 3 << 20)           # an LFS file, 3 MiB
    return {"callgg/pig-clip-tokenizer": tok, "callgg/t5-v1_1-xxl-encoder-bf16": teacher}


@pytest.fixture
def hub(repos, monkeypatch):
    with LocalHub(repos) as h:
        go_online(monkeypatch, h.url)
        monkeypatch.setenv(materials.STALL_ENV, "2")
        yield h


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return Project.create(tmp_path / "projects" / "t5_adapter", "t5xxl_pixart")


def _env(hub) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=hub.url, PYTHONPATH=str(REPO), **{materials.STALL_ENV: "2"})
    return env


def _status(project, material_id, online=True):
    m = find_material(project.pack, material_id)
    return materials.material_status(project, m, materials.list_files(m) if online else None)


def test_download_selects_the_patterns_and_verifies_every_file(hub, project, repos):
    m = find_material(project.pack, "student_tokenizer")
    assert _status(project, m.id).status == "missing"
    events = []
    materials.download(project, m, events.append)
    dest = resolve_material(project, m.id)
    assert sorted(p.name for p in dest.iterdir()) == sorted(TOKENIZER_FILES)    # no README, no .partial left
    for name in TOKENIZER_FILES:
        assert (dest / name).read_bytes() == repos["callgg/pig-clip-tokenizer"][name]
    st = _status(project, m.id)
    assert st.status == "ready" and st.files_done == st.files_total == 6
    assert st.bytes_done == st.bytes_total == sum(len(repos["callgg/pig-clip-tokenizer"][f]) for f in TOKENIZER_FILES)
    assert events[-1] == {"type": "progress", "count": st.bytes_total, "total": st.bytes_total, "unit": "bytes"}


def test_without_a_project_token_the_download_sends_the_hugging_face_logins(hub, project):
    import huggingface_hub.constants as hf_constants
    stored = Path(hf_constants.HF_TOKEN_PATH)                 # `hf auth login`'s file, under the test HOME
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text("hf_fromTheLogin\n", encoding="utf-8")
    materials.download(project, find_material(project.pack, "student_tokenizer"), lambda event: None)
    sent = [r.headers.get("authorization") for r in hub.requests if "/resolve/" in r.path]
    assert sent and all(a == "Bearer hf_fromTheLogin" for a in sent)
    assert not (project.root / ".hf_token").exists()          # the login's token is not copied into the project


def test_a_killed_job_resumes_its_file_with_a_range_request(hub, project, repos):
    hub.delay_s = 0.02                                       # slow enough to be killed mid-file
    pid = materials.start_job(project, "teacher")
    dest = resolve_material(project, "teacher")
    part = dest / materials.PARTIAL_DIR / "model.safetensors"
    deadline = time.monotonic() + 60
    while not (part.is_file() and part.stat().st_size > 256 << 10):
        assert time.monotonic() < deadline, "the job never started writing the weights"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    have = part.stat().st_size
    assert 0 < have < len(repos["callgg/t5-v1_1-xxl-encoder-bf16"]["model.safetensors"])
    assert _status(project, "teacher").status == "partial"
    hub.delay_s = 0.0
    hub.clear_requests()
    r = subprocess.run([sys.executable, "-m", "trainer_core", "download", "--project", str(project.root),
                        "--id", "teacher"], capture_output=True, text=True, timeout=120, env=_env(hub))
    assert r.returncode == 0, r.stderr
    ranges = [h.get("range") for method, path, h in hub.requests if method == "GET" and "model.safetensors" in path]
    assert ranges and ranges[0] == f"bytes={have}-"          # continued, not restarted
    data = (dest / "model.safetensors").read_bytes()
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(
        repos["callgg/t5-v1_1-xxl-encoder-bf16"]["model.safetensors"]).hexdigest()
    assert _status(project, "teacher").status == "ready"


def _wait_gone(pid: int, timeout: float = 30) -> None:
    import psutil
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        pass


def test_a_stalled_transfer_is_resumed_by_the_watchdog(hub, project, repos):
    import threading
    key = ("callgg/t5-v1_1-xxl-encoder-bf16", "model.safetensors")
    hub.stall_after[key] = 100_000
    events, errors = [], []

    def run():
        try:
            materials.download(project, find_material(project.pack, "teacher"), events.append)
        except Exception as e:       # noqa: BLE001 — reported by the assertion below
            errors.append(e)
    worker = threading.Thread(target=run)
    worker.start()
    assert hub.stalled.wait(60), "the transfer never reached the stall"
    del hub.stall_after[key]          # the stalled connection stays silent; the next request is served
    worker.join(120)
    assert not worker.is_alive() and not errors, errors
    warnings = [e["message"] for e in events if e.get("type") == "log" and "resuming at byte 100000" in e["message"]]
    assert warnings, events
    dest = resolve_material(project, "teacher")
    assert (dest / "model.safetensors").read_bytes() == repos[key[0]][key[1]]
    ranges = [h.get("range") for method, path, h in hub.requests if method == "GET" and "model.safetensors" in path]
    assert ranges[-1] == "bytes=100000-", ranges


def test_two_requests_make_one_job(hub, project):
    hub.delay_s = 0.02
    first = materials.start_job(project, "teacher")
    deadline = time.monotonic() + 30
    while not materials.job_running(project, "teacher"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert materials.start_job(project, "teacher") is None
    assert _status(project, "teacher", online=False).status == "downloading"
    # a job launched anyway (a race between two launchers) finds the lock held and exits at once
    r = subprocess.run([sys.executable, "-m", "trainer_core.materials", "--project", str(project.root), "--id", "teacher"],
                       capture_output=True, text=True, timeout=60, env=_env(hub))
    assert r.returncode == 0 and "another job" in r.stdout
    os.kill(first, signal.SIGKILL)
    _wait_gone(first)


def test_insufficient_disk_space_is_refused_with_the_numbers(hub, project):
    hub.fake_sizes[("callgg/t5-v1_1-xxl-encoder-bf16", "model.safetensors")] = 10 ** 15
    with pytest.raises(materials.DownloadError, match=r"needs .* GiB more but .* has only .* GiB free"):
        materials.download(project, find_material(project.pack, "teacher"))
    dest = resolve_material(project, "teacher")
    assert not (dest / materials.PARTIAL_DIR).exists() or not any((dest / materials.PARTIAL_DIR).iterdir())


def _complete_copy(folder: Path, repos: dict, repo: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in repos[repo].items():
        if name != "README.md":
            (folder / name).write_bytes(data)


@pytest.mark.parametrize("where", ["env", "cwd", "cwd_materials", "project", "parent", "sibling"])
def test_discovery_links_a_copy_found_elsewhere(project, repos, tmp_path, monkeypatch, where):
    if where == "env":
        store = tmp_path / "store"
        monkeypatch.setenv(materials.MATERIALS_ENV, str(store))
        folder = store / "pig-clip-tokenizer"
    elif where == "cwd":
        folder = tmp_path / "pig-clip-tokenizer"                # the cwd is tmp_path
    elif where == "cwd_materials":
        folder = tmp_path / "materials" / "pig-clip-tokenizer"
    elif where == "project":
        folder = project.root / "pig-clip-tokenizer"
    elif where == "parent":
        folder = project.root.parent / "pig-clip-tokenizer"
    else:
        other = Project.create(tmp_path / "projects" / "older", "llada_image")
        folder = other.materials_dir / "pig-clip-tokenizer"
    _complete_copy(folder, repos, "callgg/pig-clip-tokenizer")
    (folder.parent / "pig_clip-q8.gguf").write_bytes(b"q" * 10)
    (folder.parent / "pig_clip-f16.gguf").write_bytes(b"f" * 5)
    linked = dict(materials.adopt_existing(project))
    assert linked["student_tokenizer"] == folder.resolve()
    assert linked["student"].name == "pig_clip-f16.gguf"        # f16 preferred over a bigger quant
    project = Project.open(project.root)
    assert project.settings.materials["student_tokenizer"].path == str(folder.resolve())
    st = _status(project, "student_tokenizer", online=False)
    assert st.status == "ready" and st.linked
    assert materials.adopt_existing(project) == []             # nothing left to link


def test_offline_status_comes_from_the_disk(project, repos):
    m = find_material(project.pack, "student_tokenizer")
    dest = resolve_material(project, m.id)
    assert _status(project, m.id, online=False).status == "missing"
    dest.mkdir(parents=True)
    (dest / "config.json").write_bytes(b"{}")
    assert _status(project, m.id, online=False).status == "partial"        # a pattern matches nothing yet
    _complete_copy(dest, repos, "callgg/pig-clip-tokenizer")
    assert _status(project, m.id, online=False).status == "ready"
    (dest / materials.PARTIAL_DIR).mkdir()
    (dest / materials.PARTIAL_DIR / "tokenizer.json").write_bytes(b"half")
    assert _status(project, m.id, online=False).status == "partial"        # a download was interrupted


def test_online_status_checks_sizes_against_the_listing(hub, project, repos):
    dest = resolve_material(project, "student_tokenizer")
    _complete_copy(dest, repos, "callgg/pig-clip-tokenizer")
    assert _status(project, "student_tokenizer").status == "ready"
    (dest / "vocab.json").write_bytes(b"truncated")
    st = _status(project, "student_tokenizer")
    assert st.status == "partial" and st.files_done == 5


def test_download_cli_links_reports_and_fails_clearly_offline(project, repos, tmp_path):
    env = {k: v for k, v in os.environ.items()}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", PYTHONPATH=str(REPO))     # nothing listens there
    env.pop("HF_HUB_OFFLINE", None)
    r = subprocess.run([sys.executable, "-m", "trainer_core", "download", "--project", str(project.root),
                        "--id", "teacher"], capture_output=True, text=True, timeout=120, env=env)
    # one probe, no retries (issue 56: 54 s of retry lines before the sentence), and one sentence
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Retry" not in r.stderr, r.stderr
    assert r.stderr.startswith("Nothing was downloaded for teacher: the Hugging Face Hub (http://127.0.0.1:9) "
                               "cannot be reached")
    r = subprocess.run([sys.executable, "-m", "trainer_core", "download", "--project", str(project.root),
                        "--id", "nope"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0 and "no such material" in r.stderr


def test_a_hub_that_never_answers_costs_one_probe_and_one_sentence(project):
    """A network that swallows requests (a captive portal, a dead proxy): the connection opens, no answer
    comes. `download` waits once, for cli_tools.HUB_PROBE_S, and says so; no listing, no retry."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])     # held open, never read, never answered
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{server.getsockname()[1]}", PYTHONPATH=str(REPO))
    env.pop("HF_HUB_OFFLINE", None)
    try:
        r = subprocess.run([sys.executable, "-m", "trainer_core", "download", "--project", str(project.root)],
                           capture_output=True, text=True, timeout=120, env=env)
    finally:
        server.close()
        for conn in accepted:
            conn.close()
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("Nothing was downloaded for student_tokenizer, teacher: the Hugging Face Hub") \
        and "cannot be reached: timed out" in r.stderr
    assert len(accepted) == 1                     # the probe; nothing after it


def test_ctrl_c_exits_130_and_the_token_never_reaches_a_log(hub, project):
    project.update_settings(["hf_token=hf_SecretForTheHubOnly"])
    key = ("callgg/t5-v1_1-xxl-encoder-bf16", "model.safetensors")
    hub.stall_after[key] = 50_000
    env = _env(hub)
    env[materials.STALL_ENV] = "60"
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core", "download", "--project", str(project.root),
                             "--id", "teacher"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert hub.stalled.wait(60), "the download never reached the stall"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "run the same command again" in err
    authorized = [r.headers.get("authorization") for r in hub.requests if "/resolve/" in r.path]
    assert authorized and all(a == "Bearer hf_SecretForTheHubOnly" for a in authorized)
    assert "hf_SecretForTheHubOnly" not in out + err
    del hub.stall_after[key]
    hub.release()
    pid = materials.start_job(project, "teacher")               # the detached job: its log stays clean
    _wait_gone(pid, 120)
    log = (materials.downloads_dir(project) / "teacher.log").read_text(encoding="utf-8")
    assert "verified" in log and "hf_SecretForTheHubOnly" not in log
    assert _status(project, "teacher").status == "ready"


def test_materials_sharing_a_folder_are_told_apart(tmp_path):
    llada = Project.create(tmp_path / "llada_adapter", "llada_image")
    root = resolve_material(llada, "teacher")
    assert root == resolve_material(llada, "sigvq")              # one snapshot folder, two materials
    for name in ("model_index.json", "text_encoder/config.json", "queryformer/config.json",
                 "text_projection/config.json", "tokenizer/tokenizer.json"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"{}" * 10)
    teacher = materials.material_status(llada, find_material(llada.pack, "teacher"))
    sigvq = materials.material_status(llada, find_material(llada.pack, "sigvq"))
    assert (teacher.status, teacher.bytes_done) == ("ready", 100)
    assert (sigvq.status, sigvq.bytes_done) == ("missing", 0)


def test_an_image_preset_is_a_dataset_material_downloaded_and_read_by_the_corpus(tmp_path, monkeypatch):
    """MageFlow's Flickr30k preset: listed with the pack's materials, fetched from a dataset repo with
    only its two patterns, then the corpus stage reads the downloaded zip and csv."""
    import csv
    import io
    import json
    import zipfile

    from PIL import Image

    from trainer_core.base.events import ListReport
    from trainer_core.stages import corpus

    images, rows = io.BytesIO(), []
    with zipfile.ZipFile(images, "w") as z:
        for i in range(12):
            png = io.BytesIO()
            Image.new("RGB", (40 + i, 30), (10 * i, 100, 50)).save(png, format="PNG")
            z.writestr(f"flickr30k-images/{1000 + i}.jpg", png.getvalue())
            rows.append({"filename": f"{1000 + i}.jpg", "raw": json.dumps([f"a red ball number {i}", "a dog"])})
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=["filename", "raw"])
    writer.writeheader()
    writer.writerows(rows)
    files = {"flickr30k-images.zip": images.getvalue(), "flickr_annotations_30k.csv": table.getvalue().encode(),
             "README.md": b"not selected"}
    monkeypatch.chdir(tmp_path)
    project = Project.create(tmp_path / "mf", "qwen3vl_mageflow")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt number {i} with words\n" for i in range(30)))
    project.update_settings(["corpus.presets=[]", f"corpus.extra_files={prompts}", "corpus.n_image=6", "corpus.n_two=2",
                             "corpus.n_text=10", "corpus.n_val_image=2", "corpus.n_val_text=4"])
    project = Project.open(project.root)
    assert [m.id for m in project.pack.project_materials(project)][-1] == "images_flickr30k"
    with LocalHub({"nlphuji/flickr30k": files}, repo_types={"nlphuji/flickr30k": "dataset"}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        import huggingface_hub.constants as constants
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        m = find_material(project.pack, "images_flickr30k")
        materials.download(project, m, lambda e: None)
        assert _status(project, m.id).status == "ready"
    dest = resolve_material(project, m.id)
    assert sorted(p.name for p in dest.iterdir()) == ["flickr30k-images.zip", "flickr_annotations_30k.csv"]
    assert corpus.run(project, ListReport()) == "done"
    train = [json.loads(line) for line in (project.data_dir / "train.jsonl").read_text().splitlines()]
    assert sum(len(r["images"]) == 1 for r in train) == 6 and sum(len(r["images"]) == 2 for r in train) == 2
    assert all((project.data_dir / p).is_file() for r in train for p in r["images"])
