"""Banners of actions that go on after their answer give way to the outcome once the action has ended
(ui/action_banner.py), through the Train tab's tick; other banners are never touched."""
from __future__ import annotations

import subprocess
import sys
import time

from trainer_core.project import Project
from ui import setup_tab, train_tab
from ui.action_banner import RUN, SILENT_JOB_S, SNAPSHOT, follow_up
from ui.common import banner

STARTED = banner("Pipeline started (pid 4242); follow it on the Train tab.", "ok", wait=RUN)
BANNER = 10                     # train_tick's output for the banner
STOP = banner("Stop requested — the pipeline saves its checkpoint and exits.", "notice", wait=RUN)


def _report(status, **more):
    return {"status": status, "checkpoints": {"last": {"step": 213}}, **more}


def test_a_run_banner_stays_while_the_run_goes_on_and_then_says_how_it_ended():
    assert follow_up(STARTED, _report("running")) is None
    assert "The run stopped at step 213" in follow_up(STARTED, _report("stopped"))
    assert "The run finished" in follow_up(STOP, _report("done"))
    failed = follow_up(STARTED, _report("failed", error="precompute: out of memory"))
    assert "precompute: out of memory" in failed and "gt-error" in failed
    assert "data-wait" not in follow_up(STARTED, _report("stopped"))      # the outcome waits for nothing


def test_a_report_read_before_the_banner_never_judges_it():
    """A report read before Start returned shows the run before this one (done, stopped): the banner of
    the new run stays until a report read after it."""
    shown = banner("Pipeline started (pid 4242); follow it on the Train tab.", "ok", wait=RUN)
    assert follow_up(shown, _report("done", read_at=time.time() - 1)) is None
    assert "The run finished" in follow_up(shown, _report("done", read_at=time.time() + 1))
    assert follow_up(shown, _report("running", read_at=time.time() + 1)) is None


def test_a_snapshot_banner_waits_for_its_own_job(monkeypatch):
    real_time = time.time
    shown = banner("Snapshot export started (pid 4242)", "ok", wait=SNAPSHOT, pid=4242)
    earlier = {"status": "done", "pid": 17, "path": "/x/pig-step100-f16.gguf", "step": 100}
    # a job that has not written its status yet (a live process of ours, named as ours are)
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "trainer_core.snapshot"])
    try:
        alive = banner("Snapshot export started", "ok", wait=SNAPSHOT, pid=job.pid)
        assert follow_up(alive, _report("running", snapshot_job=earlier)) is None
        assert follow_up(alive, _report("running", snapshot_job={"status": "running", "pid": job.pid})) is None
    finally:
        job.kill()
        job.wait()
    # gone, but the report may not show its status yet (the Supervisor reads it every few seconds): it waits …
    assert follow_up(alive, _report("idle", snapshot_job=earlier)) is None
    # … until a job that is gone has said nothing for SILENT_JOB_S: it died before it could
    monkeypatch.setattr(time, "time", lambda: real_time() + SILENT_JOB_S + 1)
    assert follow_up(alive, _report("idle", snapshot_job=earlier)) == ""
    done = follow_up(shown, _report("running", snapshot_job={**earlier, "pid": 4242, "path": "/x/pig-step240-f16.gguf",
                                                              "step": 240}))
    assert "Snapshot exported: pig-step240-f16.gguf (step 240)" in done
    failed = follow_up(shown, _report("idle", snapshot_job={"status": "failed", "pid": 4242, "error": "disk full"}))
    assert "failed: disk full" in failed


def test_other_banners_are_left_alone():
    for shown in ("", None, banner("Saved 3 setting(s).", "ok"), banner("Open or create a project first.")):
        assert follow_up(shown, _report("done")) is None


def test_the_tick_replaces_the_stop_banner_by_the_outcome_and_leaves_others(ctx):
    root = setup_tab.create_project(ctx, "mine", "t5xxl_pixart", str(ctx.projects_root))[0]
    # the handler's own banner; nothing runs here, so it has nothing to wait for: the next tick clears it
    stop = train_tab.stop_run(ctx, root)
    assert "Stop requested" in stop and 'data-wait="run"' in stop
    assert not isinstance(train_tab.train_tick(ctx, root, -1, stop)[BANNER], str)   # read before it: not judged
    ctx.supervisor.poke(root)                                                # the next reading
    assert train_tab.train_tick(ctx, root, -1, stop)[BANNER] == ""
    # a run that ended stopped, as its driver leaves state.json: the tick says so in the banner's place
    project = Project.open(root)
    project.write_state({**project.read_state(), "status": "stopped"})
    ctx.supervisor.poke(root)
    assert "The run stopped" in train_tab.train_tick(ctx, root, -1, stop)[BANNER]
    # a banner of no action stays as it is (the tick skips it), as does any while no project is open
    skip = type(train_tab.train_tick(ctx, None, -1, stop)[BANNER])
    assert isinstance(train_tab.train_tick(ctx, root, -1, banner("Saved 3 setting(s).", "ok"))[BANNER], skip)
    assert not isinstance(skip(), str)
