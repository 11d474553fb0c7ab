"""The CLI and the pipeline driver end to end: `new`, `run --only corpus`, events, state, status."""
from __future__ import annotations

import json
from pathlib import Path

from trainer_core.base.events import EventTailer
from trainer_core.contract.corpus_files import read_corpus


def events_of(root: Path) -> list[dict]:
    return EventTailer(root / "events.jsonl").read()


def test_new_then_run_only_corpus(text_project, run_cli):
    root = text_project
    r = run_cli("run", "--project", str(root), "--only", "corpus")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "[corpus] starting" in r.stdout  # the foreground run streams its log

    train = read_corpus(root / "data" / "train.txt")
    val = read_corpus(root / "data" / "val.txt")
    # 600 distinct prompts, n_val 40 -> 560 train; empty_frac 0.01 -> int(560*0.01)=5 and max(1, int(0.4))=1
    assert len(val) == 40 and len(train) == 560
    assert train.count("") == 5 and val.count("") == 1
    assert not ({p for p in train if p} & {p for p in val if p})

    events = events_of(root)
    runs = {e["run"] for e in events}
    assert len(runs) == 1 and None not in runs
    statuses = [(e["stage"], e["payload"]["status"]) for e in events if e["type"] == "status"]
    assert statuses == [(None, "running"), ("corpus", "running"), ("corpus", "done"), (None, "done")]
    artifacts = {e["payload"]["kind"]: e["payload"] for e in events if e["type"] == "artifact"}
    assert artifacts["corpus_train"]["lines"] == 560 and artifacts["corpus_train"]["empty"] == 5
    assert artifacts["corpus_val"]["lines"] == 40 and artifacts["corpus_val"]["empty"] == 1
    assert all(e["stage"] == "corpus" for e in events if e["type"] in ("progress", "artifact", "log"))

    state = json.loads((root / "state.json").read_text())
    assert state["status"] == "done" and state["pid"] is None
    assert state["stages"]["corpus"]["status"] == "done"
    assert "pipeline.pid" not in {p.name for p in root.iterdir()}

    # a second run skips the stage: done is decided from the files
    before = (root / "data" / "train.txt").stat().st_mtime_ns
    r = run_cli("run", "--project", str(root), "--only", "corpus")
    assert r.returncode == 0 and "already done, skipping" in r.stdout
    assert (root / "data" / "train.txt").stat().st_mtime_ns == before
    second = [e for e in events_of(root) if e["run"] not in runs]
    assert [(e["stage"], e["payload"]) for e in second if e["type"] == "status" and e["stage"]] == [
        ("corpus", {"status": "done", "skipped": True})]


def test_a_run_missing_materials_names_them_all_and_launches_nothing(text_project, run_cli):
    """Checked once before launching (issue 40 item 2): every missing material, each with what provides it;
    `start` and `run` alike, exit 2, nothing run or written."""
    before = sorted(p.name for p in text_project.iterdir())
    for command in ("run", "start"):
        r = run_cli(command, "--project", str(text_project))
        assert r.returncode == 2
        lines = r.stderr.strip().splitlines()
        assert lines[0] == "Not started: this run needs 3 materials first:"
        assert any("student GGUF is not set" in line and "materials.student.path=FILE" in line for line in lines)
        assert any("tokenizer" in line and "gguf-trainer download" in line for line in lines)
        assert any("(teacher) is not downloaded" in line and "gguf-trainer download" in line for line in lines)
        assert "Traceback" not in r.stdout + r.stderr
    assert sorted(p.name for p in text_project.iterdir()) == before          # no run, no state, no log
    # a stage that needs no material still runs
    assert run_cli("run", "--project", str(text_project), "--only", "corpus").returncode == 0
    report = json.loads(run_cli("status", "--project", str(text_project), "--json").stdout)
    by_name = {st["name"]: st for st in report["stages"]}
    assert by_name["corpus"]["done"] is True and by_name["precompute_val"]["status"] == "-"
    assert [st["name"] for st in report["stages"]] == [
        "corpus", "precompute_val", "precompute_train", "train", "export", "eval"]


def test_run_steps_sets_before_running(text_project, run_cli):
    r = run_cli("run", "--project", str(text_project), "--only", "corpus", "--steps", "1.5k")
    assert r.returncode == 0
    assert "train.steps: 20000 -> 1500" in r.stdout
    assert json.loads((text_project / "project.json").read_text())["train"]["steps"] == 1500
    r = run_cli("set", "--project", str(text_project))
    assert r.stdout.strip() == "train.steps: 1500"


def test_set_steps_hints_from_the_checkpoint_sidecar(text_project, run_cli):
    ckpt = text_project / "checkpoints"
    ckpt.mkdir()
    (ckpt / "last.json").write_text(json.dumps({"step": 5000, "steps": 20000}))
    r = run_cli("set", "--project", str(text_project), "--steps", "4k")
    assert "train.steps: 20000 -> 4000" in r.stdout and "already covers it" in r.stdout
    r = run_cli("set", "--project", str(text_project), "--steps", "12,000")
    assert "continues from step 5000 to 12000" in r.stdout
    r = run_cli("set", "--project", str(text_project), "--steps", "12_000")
    assert "no setting changed" in r.stdout


def test_status_of_a_new_project_and_version(tmp_path, run_cli):
    root = tmp_path / "t5_adapter"
    assert run_cli("new", "--project", str(root), "--pack", "t5xxl_pixart").returncode == 0
    report = json.loads(run_cli("status", "--project", str(root), "--json").stdout)
    assert report["status"] == "idle" and report["pack"] == "t5xxl_pixart"
    assert report["name"] == "pig_t5_adapter"
    assert report["export"] == str(tmp_path / "pig_t5_adapter-f16.gguf")
    assert all(st["status"] == "-" for st in report["stages"])
    v = run_cli("--version")
    assert v.returncode == 0 and v.stdout.startswith("gguf-trainer ")
    packs = run_cli("packs").stdout.split()
    assert {"llada_image", "qwen3vl_mageflow", "qwen3vl_qwenimage", "t5xxl_pixart"} <= set(packs)


def test_app_py_refuses_to_expose_itself_without_a_login(tmp_path):
    import subprocess
    import sys

    from conftest import REPO
    for extra in (["--host", "0.0.0.0"], ["--share"]):
        r = subprocess.run([sys.executable, str(REPO / "app.py"), "--no-browser", *extra], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 2 and "--auth" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_app_py_demo_serves_the_gui_and_the_run_outlives_it(tmp_path, isolated_env, request):
    """`python app.py --demo`: the GUI comes up on loopback with the demo running; closing the
    GUI does not stop the run, which finishes every stage on its own. The demo lands in the
    projects root (not the current folder) and the whole run asks the Hub nothing."""
    import json
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from conftest import REPO, cli
    from hub_server import LocalHub
    hub = LocalHub({}).start()                      # every request the demo makes would land here
    request.addfinalizer(hub.stop)
    env = hub.client_env(tmp_path / "hf-home")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gui = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--demo", "--no-browser", "--port", str(port)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)
    try:
        seen = []
        for line in gui.stdout:                  # the launch line comes once the server listens
            seen.append(line)
            if f"at http://127.0.0.1:{port}/" in line:
                break
        assert any("demo: " in line for line in seen), "".join(seen)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            assert r.status == 200 and "gradio" in r.read().decode("utf-8", "replace").lower()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=30) as r:
            tabs = [c["props"] for c in json.loads(r.read())["components"] if c["props"].get("elem_id") == "tabs"]
        assert [t.get("selected") for t in tabs] == ["train"]          # it opens where the run is to watch
        root = isolated_env / "gguf-trainer" / "projects" / "demo" / "t5_adapter"
        running = json.loads(cli("status", "--project", str(root), "--json").stdout)
        assert running["status"] == "running", running      # the GUI goes while the run is under way
    finally:
        gui.terminate()
        gui.wait(timeout=60)
    from trainer_core.project import Project
    from trainer_core.status import status_report
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:            # what `status --json` prints, without a process a second
        report = status_report(Project.open(root))
        if report["status"] != "running":
            break
        time.sleep(1)                             # polling another process's run: no event reaches this one
    assert report["status"] == "done", report
    assert json.loads(cli("status", "--project", str(root), "--json").stdout)["status"] == "done"
    assert all(stage["done"] for stage in report["stages"])
    assert not (tmp_path / "gguf-trainer-demo").exists()         # nothing lands in the current folder
    assert hub.requests == []


def test_start_steps_sets_then_launches(text_project, run_cli):
    import re

    import psutil

    from trainer_core.runner import wait_gone
    r = run_cli("start", "--project", str(text_project), "--steps", "40k", "--only", "corpus")
    assert r.returncode == 0, r.stderr
    assert "train.steps: 20000 -> 40000" in r.stdout
    pid = int(re.search(r"pipeline launched \(pid (\d+)\)", r.stdout).group(1))
    try:
        assert wait_gone([psutil.Process(pid)], 120)
    except psutil.NoSuchProcess:
        pass
    assert json.loads((text_project / "project.json").read_text())["train"]["steps"] == 40000
    assert json.loads((text_project / "state.json").read_text())["status"] == "done"


def test_set_never_echoes_the_hub_token(tmp_path, run_cli):
    root = tmp_path / "p"
    assert run_cli("new", "--project", str(root), "--pack", "t5xxl_pixart").returncode == 0
    r = run_cli("set", "--project", str(root), "--set", "hf_token=hf_DoNotPrintMe")
    assert r.returncode == 0 and "hf_token: set (hidden)" in r.stdout
    assert "hf_DoNotPrintMe" not in r.stdout + r.stderr
    status = run_cli("status", "--project", str(root), "--json")
    assert "hf_DoNotPrintMe" not in status.stdout


def test_the_driver_removes_the_temps_a_killed_driver_left_and_nothing_else(text_project, run_cli):
    root = text_project
    ours = [root / ".state.json.k2j4.tmp", root / ".pipeline.pid.zz9.tmp", root / ".stage.pid.a1.tmp",
            root / ".plan.json.q7.tmp"]
    others = [root / ".project.json.b3.tmp", root / ".state.json.tmp"]     # another file's; not the temp pattern
    for f in ours + others:
        f.write_text("{half")
    r = run_cli("run", "--project", str(root), "--only", "corpus")
    assert r.returncode == 0, r.stderr + r.stdout
    assert not [f for f in ours if f.exists()] and all(f.exists() for f in others)
    assert json.loads((root / "state.json").read_text())["status"] == "done"
