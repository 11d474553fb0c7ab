"""The detached-job runtime (trainer_core/jobs.py) with real detached processes: a job reports
through events, its status file follows, and its status reads back with the process's liveness."""
from __future__ import annotations

import os
import signal
import sys
import textwrap
import time

import psutil
import pytest

from trainer_core.base.events import EventTailer
from trainer_core.jobs import JobFiles, JobReport, launch, read_status

# The job's body, as a module would have it; `trainer_core` in the script's name is the command-line
# marker that makes the process count as ours.
_JOB = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trainer_core.base.errors import TrainerError
    from trainer_core.jobs import JobFiles, JobReport, run_job

    folder, mode = Path(sys.argv[1]), sys.argv[2]
    files = JobFiles(folder / "t.status", folder / "t.pid", folder / "t.log", what="the test job")
    report = JobReport(files, phase="starting", mode=mode)

    def body():
        report("status", status="running", phase="working")
        report("progress", count=1, total=2, unit="parts")
        report("log", level="info", message="half way")
        if mode == "hang":
            (folder / "ready").write_text("ready")
            time.sleep(120)
        if mode == "refuse":
            raise TrainerError("The input is not there; pick another.")
        if mode == "bug":
            raise KeyError("oops")
        report("progress", count=2, total=2, unit="parts")
        return {"phase": "done", "result": 42}
    sys.exit(run_job(report, body))
""")


@pytest.fixture
def job(tmp_path):
    script = tmp_path / "trainer_core_test_job.py"
    script.write_text(_JOB)
    files = JobFiles(tmp_path / "t.status", tmp_path / "t.pid", tmp_path / "t.log", what="the test job")

    def start(mode: str) -> int:
        return launch(files, [sys.executable, str(script), str(tmp_path), mode], cwd=tmp_path)
    return files, start


def _wait(pid: int, timeout: float = 60) -> None:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        pass


def test_a_detached_job_reports_through_events_and_its_status_reads_back(job):
    files, start = job
    pid = start("ok")
    assert files.pid.is_file()
    _wait(pid)
    status = read_status(files)
    assert status["status"] == "done" and status["pid"] == pid and status["mode"] == "ok"
    assert status["phase"] == "done" and status["result"] == 42
    assert status["progress"] == {"count": 2, "total": 2, "unit": "parts"}
    assert status["finished"] >= status["started"]
    # the log is the launch banner, then the events in the stages' schema (the tailer skips the banner)
    events = EventTailer(files.log).read()
    assert [e["type"] for e in events] == ["status", "progress", "log", "progress", "status"]
    assert events[0]["payload"] == {"status": "running", "phase": "working"}
    assert events[-1]["payload"] == {"status": "done", "phase": "done", "result": 42}
    assert files.log.read_text().startswith("===== launch")


@pytest.mark.parametrize("mode, error", [("refuse", "The input is not there; pick another."),
                                         ("bug", "KeyError: 'oops'")])
def test_a_failed_job_records_the_message_and_a_bug_its_traceback(job, mode, error):
    files, start = job
    pid = start(mode)
    _wait(pid)
    status = read_status(files)
    assert status["status"] == "failed" and status["error"] == error and "finished" in status
    assert EventTailer(files.log).read()[-1]["payload"] == {"message": error}
    assert ("Traceback (most recent call last)" in files.log.read_text()) == (mode == "bug")


def test_a_job_that_died_reads_as_failed(job, tmp_path):
    files, start = job
    pid = start("hang")
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
        status = read_status(files)
        assert status["status"] == "running" and status["phase"] == "working"
        assert status["progress"]["count"] == 1
    finally:
        os.kill(pid, signal.SIGKILL)
        _wait(pid)
    status = read_status(files)
    assert status["status"] == "failed" and status["error"] == "the test job died (see t.log)"
    assert read_status(files, liveness=False)["status"] == "running"        # as the file recorded it


def test_a_status_file_in_process(tmp_path):
    """JobReport without a process around it: what each event type does to the status file."""
    import io
    files = JobFiles(tmp_path / "s.status", tmp_path / "s.pid", tmp_path / "s.log")
    out = io.StringIO()
    report = JobReport(files, stream=out, kind="test")
    assert read_status(files, liveness=False)["status"] == "running"
    report("metric", step=1, loss=0.5)                  # the log's, not the status file's
    assert "loss" not in read_status(files, liveness=False)
    report("error", message="no disk")
    status = read_status(files, liveness=False)
    assert (status["status"], status["error"], status["kind"]) == ("failed", "no disk", "test")
    assert len(out.getvalue().splitlines()) == 2
    assert not files.pid.exists()                         # only `launch` writes one
