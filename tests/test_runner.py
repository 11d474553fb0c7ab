"""Detached runs, the run lock, stop, kill -9 and resume.

The corpus stage of these projects reads its prompts from a named pipe (FIFO): the stage
blocks in its read until the test writes the prompts, so "a stage is running" is a state
the test controls, not a race it hopes to win. Opening the FIFO for writing returns only
once the stage has opened it for reading.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from conftest import write_prompts
from trainer_core.base.events import EventTailer
from trainer_core.runner import wait_gone

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX named pipes")


# corpus blocks on the FIFO, train then fails (no shards); neither needs a material, so `start`'s materials
# check (which refuses a run that would precompute without them) lets these runs launch
STAGES = ("--only", "corpus", "train")


@pytest.fixture
def fifo_project(tmp_path, run_cli):
    root = tmp_path / "llada_adapter"
    fifo = tmp_path / "prompts.txt"
    os.mkfifo(fifo)
    assert run_cli("new", "--project", str(root), "--pack", "llada_image").returncode == 0
    r = run_cli("set", "--project", str(root), "--set", "corpus.presets=[]",
                "--set", f"corpus.extra_files={fifo}", "--set", "corpus.n_val=40")
    assert r.returncode == 0, r.stderr
    source = tmp_path / "source.txt"
    write_prompts(source, 600)
    return root, fifo, source


def feed(fifo: Path, source: Path) -> None:
    """Blocks until the corpus stage has the FIFO open, then hands it the prompts."""
    with open(fifo, "wb") as f:
        f.write(source.read_bytes())


def wait_reader(fifo: Path) -> int:
    """Blocks until the stage opens the FIFO; returns the write end (the stage stays blocked)."""
    return os.open(fifo, os.O_WRONLY)


def launched_pid(stdout: str) -> int:
    return int(re.search(r"pipeline launched \(pid (\d+)\)", stdout).group(1))


def drivers_of(root: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "trainer_core.pipeline" in cmd and str(root) in cmd:
            found.append(proc)
    return found


def wait_exit(pid: int, timeout: float = 120) -> None:
    """Wait for a detached process (not our child, so no exit code) to end."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    assert wait_gone([proc], timeout), f"process {pid} still running"


def final_status(root: Path) -> str:
    return json.loads((root / "state.json").read_text())["status"]


def statuses(root: Path, run: str | None = None) -> list[tuple]:
    return [(e["stage"], e["payload"]["status"], e["payload"].get("skipped", False))
            for e in EventTailer(root / "events.jsonl").read()
            if e["type"] == "status" and (run is None or e["run"] == run)]


def test_eight_concurrent_starts_run_one_driver(fifo_project, run_cli):
    root, fifo, source = fifo_project
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: run_cli("start", "--project", str(root), *STAGES), range(8)))
    winners = [r for r in results if r.returncode == 0]
    losers = [r for r in results if r.returncode != 0]
    assert len(winners) == 1, [r.stdout + r.stderr for r in results]
    pid = launched_pid(winners[0].stdout)
    assert len(losers) == 7
    for r in losers:
        assert r.returncode == 3
        assert "already running" in r.stderr and f"pid {pid}" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert [p.pid for p in drivers_of(root)] == [pid]

    # a foreground run is refused the same way while the detached one holds the lock
    r = run_cli("run", "--project", str(root), "--only", "corpus")
    assert r.returncode == 3 and f"pid {pid}" in r.stderr
    status = json.loads(run_cli("status", "--project", str(root), "--json").stdout)
    assert status["status"] == "running" and status["pid"] == pid

    feed(fifo, source)
    wait_exit(pid)
    assert final_status(root) == "failed"  # train: no shards (no precompute in --only)
    events = EventTailer(root / "events.jsonl").read()
    assert len({e["run"] for e in events}) == 1
    assert ("corpus", "done", False) in statuses(root)


def test_kill_9_then_status_interrupted_then_start_resumes(fifo_project, run_cli):
    root, fifo, source = fifo_project
    r = run_cli("start", "--project", str(root), *STAGES)
    assert r.returncode == 0, r.stderr
    driver = launched_pid(r.stdout)
    write_end = wait_reader(fifo)  # the corpus stage is running, blocked on its input
    stage_pid = json.loads((root / "stage.pid").read_text())["pid"]
    assert psutil.Process(stage_pid).ppid() == driver

    os.kill(driver, signal.SIGKILL)
    wait_exit(driver, 30)
    status = json.loads(run_cli("status", "--project", str(root), "--json").stdout)
    assert status["status"] == "interrupted" and status["pid"] is None
    assert status["stage"] == "corpus"
    assert "interrupted" in run_cli("status", "--project", str(root)).stdout

    # the orphaned stage still holds the project: no second run may start under it
    r = run_cli("start", "--project", str(root), *STAGES)
    assert r.returncode == 3 and f"pid {stage_pid}" in r.stderr

    # the stage finishes its (atomic) unit of work, reports to events.jsonl directly, exits
    with os.fdopen(write_end, "wb") as f:
        f.write(source.read_bytes())
    wait_exit(stage_pid, 60)
    assert (root / "data" / "train.txt").is_file() and (root / "data" / "val.txt").is_file()
    first_run = EventTailer(root / "events.jsonl").read()[0]["run"]
    assert any(e["type"] == "artifact" and e["run"] == first_run for e in EventTailer(root / "events.jsonl").read())
    assert json.loads(run_cli("status", "--project", str(root), "--json").stdout)["status"] == "interrupted"

    r = run_cli("start", "--project", str(root), *STAGES)
    assert r.returncode == 0, r.stderr
    second = launched_pid(r.stdout)
    wait_exit(second)  # fails at train: no shards
    runs = list(dict.fromkeys(e["run"] for e in EventTailer(root / "events.jsonl").read()))
    assert len(runs) == 2
    resumed = statuses(root, runs[1])
    assert ("corpus", "done", True) in resumed  # skipped: done on disk
    assert ("corpus", "running", False) not in resumed
    assert json.loads(run_cli("status", "--project", str(root), "--json").stdout)["status"] == "failed"


def test_stop_finishes_the_stage_then_stops_between_stages(fifo_project, run_cli):
    root, fifo, source = fifo_project
    r = run_cli("start", "--project", str(root), *STAGES)
    driver = launched_pid(r.stdout)
    write_end = wait_reader(fifo)
    r = run_cli("stop", "--project", str(root), "--timeout", "0")
    assert r.returncode == 0 and "stop requested" in r.stdout
    assert (root / "STOP").exists()
    with os.fdopen(write_end, "wb") as f:
        f.write(source.read_bytes())
    wait_exit(driver)
    assert statuses(root)[-1] == (None, "stopped", False)
    assert ("corpus", "done", False) in statuses(root)
    assert not any(stage == "precompute_val" for stage, _, _ in statuses(root))
    assert not (root / "STOP").exists()
    assert json.loads((root / "state.json").read_text())["status"] == "stopped"


def test_kill_command_kills_driver_and_stage(fifo_project, run_cli):
    root, fifo, source = fifo_project
    r = run_cli("start", "--project", str(root), *STAGES)
    driver = launched_pid(r.stdout)
    write_end = wait_reader(fifo)
    stage_pid = json.loads((root / "stage.pid").read_text())["pid"]
    procs = [psutil.Process(driver), psutil.Process(stage_pid)]
    r = run_cli("kill", "--project", str(root))
    assert r.returncode == 0 and "killed" in r.stdout, r.stderr
    assert wait_gone(procs, 0)
    os.close(write_end)
    state = json.loads((root / "state.json").read_text())
    assert state["status"] == "stopped" and state["error"] == "killed"


def test_auto_resume_relaunches_only_an_interrupted_last_project(fifo_project, run_cli):
    root, fifo, source = fifo_project
    r = run_cli("--auto-resume", "--no-gui")
    assert r.returncode == 0 and "relaunched" not in r.stdout  # idle: nothing to resume

    r = run_cli("start", "--project", str(root), *STAGES)
    driver = launched_pid(r.stdout)
    write_end = wait_reader(fifo)
    stage_pid = json.loads((root / "stage.pid").read_text())["pid"]
    os.kill(driver, signal.SIGKILL)
    with os.fdopen(write_end, "wb") as f:
        f.write(source.read_bytes())
    wait_exit(stage_pid, 60)

    r = run_cli("--auto-resume", "--no-gui")
    assert r.returncode == 0 and "relaunched" in r.stdout, r.stderr
    pid = int(re.search(r"\(pid (\d+)\)", r.stdout).group(1))
    wait_exit(pid)
    assert final_status(root) == "failed"
    r = run_cli("--auto-resume", "--no-gui")
    assert "relaunched" not in r.stdout  # failed is not interrupted


def test_detached_run_survives_its_launcher_session(fifo_project, run_cli):
    root, fifo, source = fifo_project
    r = run_cli("start", "--project", str(root), *STAGES)
    driver = launched_pid(r.stdout)
    # its own session: closing the terminal (SIGHUP to our session) cannot reach it
    assert os.getsid(driver) == driver and os.getsid(driver) != os.getsid(0)
    done = threading.Event()
    threading.Thread(target=lambda: (feed(fifo, source), done.set()), daemon=True).start()
    wait_exit(driver)
    assert done.is_set() and final_status(root) == "failed"
    log = (root / "pipeline.log").read_text()
    assert "===== launch " in log and "trainer_core.pipeline" in log


def test_a_run_that_ends_while_status_looks_is_done_not_interrupted(tmp_path, monkeypatch):
    """The driver writes "done" to state.json, then exits: a status that read state.json before it found the
    driver gone called a finished run interrupted (seen once in a full suite run)."""
    from trainer_core import runner
    from trainer_core.base.procs import write_pid_file
    from trainer_core.project import Project
    project = Project.create(tmp_path / "t5_adapter", "t5xxl_pixart")
    project.write_state({**project.read_state(), "status": "running"})
    write_pid_file(project.pipeline_pid, os.getpid())
    checked = []

    def finishes_now(record):                     # the driver ends between the two reads
        if record and record.get("pid") == os.getpid() and not checked:
            checked.append(record)
            project.write_state({**project.read_state(), "status": "done"})
        return False
    monkeypatch.setattr(runner, "pid_alive", finishes_now)
    assert runner.runtime_status(project)["status"] == "done"
    assert checked
