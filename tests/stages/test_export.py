"""Export, evaluation, snapshots and resets on a demo project trained end to end."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import demo_cache
from trainer_core.base.errors import AlreadyRunningError
from trainer_core.base.events import EventTailer
from trainer_core.contract.gguf_io import read_gguf_kvs
from trainer_core.base.locks import FileLock
from trainer_core.base.procs import read_pid_file
from trainer_core.project import Project
from trainer_core.resets import reset
from trainer_core.runner import wait_gone

STEPS = demo_cache.STEPS


@pytest.fixture(scope="module")
def trained():
    """The session's trained t5 demo (tests/demo_cache.py: the whole pipeline once); read only."""
    return demo_cache.trained("t5xxl_pixart")


@pytest.fixture
def project(trained, tmp_path):
    """A copy of the trained project in its own output folder."""
    return Project.open(demo_cache.copy_trained("t5xxl_pixart", tmp_path))


def wait_exit(pid: int, timeout: float = 300) -> None:
    try:
        assert wait_gone([psutil.Process(pid)], timeout)
    except psutil.NoSuchProcess:
        pass


def test_the_whole_pipeline_on_the_demo(trained, run_cli):
    gguf = trained.parent / "pig_t5_adapter-f16.gguf"           # next to the project folder
    assert gguf.is_file()
    r = run_cli("inspect", str(gguf))
    assert r.returncode == 0 and "layout: OK" in r.stdout and "variant: seeded_resampler" in r.stdout
    ev = json.loads((trained / "eval.json").read_text())
    for key in ("cos", "cos_rms", "rel_mse", "worst_row_cos", "cos_eos", "roundtrip_cos", "val_samples"):
        assert key in ev, key
    assert ev["roundtrip_cos"] >= 0.999 and ev["val_samples"] == 40
    assert ev["trained_steps"] == json.loads((trained / "checkpoints" / "best.json").read_text())["step"]
    assert ev["provenance"]["adapter.snapshot"] is False and ev["provenance"]["adapter.checkpoint"] == "best"
    status = run_cli("status", "--project", str(trained))
    assert "use it: ggk diffuser engine" in status.stdout and str(gguf) in status.stdout

    before = {p: p.stat().st_mtime_ns for p in (gguf, trained / "eval.json", trained / "checkpoints" / "last.pt")}
    again = run_cli("run", "--project", str(trained))
    assert again.returncode == 0
    assert again.stdout.count("already done, skipping") == 6
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_a_deleted_gguf_is_regenerated_byte_identical(project, run_cli):
    gguf = project.gguf_path()
    original = gguf.read_bytes()
    eval_before = project.eval_json.stat().st_mtime_ns
    gguf.unlink()
    r = run_cli("start", "--project", str(project.root), "--only", "export", "eval", "--force")
    assert r.returncode == 0, r.stderr
    wait_exit(int(re.search(r"pid (\d+)", r.stdout).group(1)))
    assert gguf.read_bytes() == original
    assert project.eval_json.stat().st_mtime_ns > eval_before
    statuses = [(e["stage"], e["payload"].get("forced")) for e in EventTailer(project.events_jsonl).read()
                if e["type"] == "status" and e["payload"]["status"] == "running" and e["stage"]]
    assert statuses[-2:] == [("export", True), ("eval", True)]


def test_extending_a_run_reexports_when_best_improves(project, run_cli):
    gguf = project.gguf_path()
    before = gguf.read_bytes()
    # the demo run is still improving at STEPS: 100 more steps raise the best val cos
    r = run_cli("run", "--project", str(project.root), "--steps", str(STEPS + 100), "--only", "train", "export", "eval")
    assert r.returncode == 0, r.stdout[-2000:]
    best = json.loads((project.checkpoints_dir / "best.json").read_text())
    assert best["step"] > STEPS
    assert "[export] starting" in r.stdout and gguf.read_bytes() != before
    kvs = read_gguf_kvs(gguf)
    assert kvs["adapter.trained_steps"] == best["step"] and kvs["adapter.planned_steps"] == STEPS + 100


def test_extending_a_run_does_not_reexport_when_best_does_not_improve(project, run_cli):
    gguf = project.gguf_path()
    before, best_before = gguf.read_bytes(), (project.checkpoints_dir / "best.json").read_bytes()
    # an absurd learning rate for the extension: validation only gets worse, best.pt stays
    project.update_settings(["train.lr=0.5", f"train.steps={STEPS + 30}"])
    r = run_cli("run", "--project", str(project.root), "--only", "train", "export", "eval")
    assert r.returncode == 0, r.stdout[-2000:]
    assert json.loads((project.checkpoints_dir / "last.json").read_text())["step"] == STEPS + 30
    assert (project.checkpoints_dir / "best.json").read_bytes() == best_before
    assert "[export] already done, skipping" in r.stdout and "[eval] already done, skipping" in r.stdout
    assert gguf.read_bytes() == before


def test_snapshot_while_training_runs(project, run_cli):
    reset(project, "train")
    planned = 5000                   # more than it trains before it is stopped, however slow the machine is
    project.update_settings([f"train.steps={planned}"])
    tail = EventTailer(project.events_jsonl, offset=project.events_jsonl.stat().st_size)  # this run's events only
    r = run_cli("start", "--project", str(project.root), "--only", "train")
    pid = int(re.search(r"pid (\d+)", r.stdout).group(1))
    while not any(e["type"] == "metric" and e["payload"].get("step", 0) >= 20 for e in tail.read()):
        assert psutil.pid_exists(pid), "the run ended before it was snapshotted"
    r = run_cli("snapshot", "--project", str(project.root), timeout=300)
    assert r.returncode == 0, r.stderr
    (entry,) = json.loads(project.snapshots_json.read_text())["snapshots"]
    assert entry["while_training"] is True and entry["checkpoint"] == "last" and entry["val_cos"] is not None
    assert entry["planned_steps"] == planned and 20 <= entry["step"] < planned
    path = Path(entry["path"])
    assert path.name == f"pig_t5_adapter-step{entry['step']}-f16.gguf" and path.parent == project.output_dir()
    kvs = read_gguf_kvs(path)
    assert kvs["adapter.snapshot"] is True and kvs["adapter.trained_steps"] == entry["step"]
    assert kvs["adapter.planned_steps"] == planned and kvs["adapter.checkpoint"] == "last"
    assert psutil.pid_exists(pid)                                       # training goes on
    assert run_cli("stop", "--project", str(project.root)).returncode == 0
    wait_exit(pid)
    assert json.loads((project.checkpoints_dir / "last.json").read_text())["step"] >= entry["step"]
    assert not project.snapshot_file.exists()


def test_snapshots_on_disk_best_no_fresh_and_eval(project, run_cli):
    best_step = json.loads((project.checkpoints_dir / "best.json").read_text())["step"]
    r = run_cli("snapshot", "--project", str(project.root), "--checkpoint", "best", "--eval")
    assert r.returncode == 0, r.stderr
    (best,) = json.loads(project.snapshots_json.read_text())["snapshots"]
    assert best["id"] == f"step{best_step}-best" and best["while_training"] is False
    assert best["eval"]["roundtrip_cos"] >= 0.999 and {"cos", "cos_eos", "rel_mse"} <= set(best["eval"])
    assert read_gguf_kvs(best["path"])["adapter.checkpoint"] == "best"
    r = run_cli("snapshot", "--project", str(project.root), "--no-fresh")
    assert r.returncode == 0, r.stderr
    entries = json.loads(project.snapshots_json.read_text())["snapshots"]
    # the file name is step-tagged: a snapshot of the same step replaces the entry of that file
    assert [e["id"] for e in entries] == ([f"step{STEPS}-last"] if best_step == STEPS
                                          else [f"step{best_step}-best", f"step{STEPS}-last"])
    final = project.gguf_path()
    assert final.is_file() and all(Path(e["path"]) != final for e in entries)   # never the final file
    assert not project.snapshot_file.exists()
    r = run_cli("snapshot", "--project", str(project.root), "--checkpoint", "step50")
    assert r.returncode == 2 and "There is no kept step step50" in r.stderr        # bad input (issue 55)
    status = run_cli("status", "--project", str(project.root)).stdout
    assert f"snapshot step {STEPS} / {STEPS} (last)" in status


def test_snapshot_after_a_stop_and_as_a_detached_job(project, run_cli):
    r = run_cli("snapshot", "--project", str(project.root), "--detach")
    assert r.returncode == 0 and "snapshot job launched" in r.stdout
    wait_exit(int(re.search(r"pid (\d+)", r.stdout).group(1)))
    status = json.loads((project.root / ".snapshot.status").read_text())
    assert status["status"] == "done" and status["step"] == STEPS
    assert Path(status["path"]).is_file()


def _listing(project: Project) -> set[str]:
    out = project.output_dir()
    return {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}


@pytest.mark.parametrize("what, gone", [
    ("state", set()),
    ("train", {"checkpoints/", "eval.json", "snapshots.json"}),
    ("shards", {"shards/", "checkpoints/", "eval.json", "snapshots.json"}),
    ("corpus", {"data/", "shards/", "checkpoints/", "eval.json", "snapshots.json"}),
    ("output", {"../pig_t5_adapter-f16.gguf", f"../pig_t5_adapter-step{STEPS}-f16.gguf", "../pig_t5_adapter-README.md",
                "../pig_t5_adapter-quality.png"}),
])
def test_each_reset_deletes_exactly_what_it_names(what, gone, project, run_cli):
    assert run_cli("snapshot", "--project", str(project.root), "--no-fresh").returncode == 0
    other = project.output_dir() / "someone_else-f16.gguf"
    other.write_bytes(b"another project's export")
    before = _listing(project)
    r = run_cli("reset", "--project", str(project.root), what)
    assert r.returncode == 0, r.stderr
    after = _listing(project)
    prefix = project.root.name + "/"

    def named(path: str) -> bool:
        for g in gone:
            full = prefix + g if not g.startswith("../") else g[3:]
            if (g.endswith("/") and path.startswith(full)) or path == full:
                return True
        return False
    removed = before - after
    assert removed == {p for p in before if named(p)} - {prefix + "state.json"}
    assert other.is_file() and (project.root / "materials" / "pig_clip-demo-f16.gguf").is_file()
    state = json.loads((project.root / "state.json").read_text())
    if what == "state":
        assert state["stages"] == {} and state["status"] == "idle"


def test_resets_are_refused_while_running(project, run_cli):
    lock = FileLock(project.run_lock)
    assert lock.acquire()
    try:
        r = run_cli("reset", "--project", str(project.root), "train")
        assert r.returncode == 3 and "stop it before resetting" in r.stderr
        assert project.checkpoints_dir.is_dir()
    finally:
        lock.release()
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "trainer_core.snapshot"])
    try:
        from trainer_core.runner import write_pid_file
        write_pid_file(project.root / ".snapshot.pid", job.pid)
        (project.root / ".snapshot.status").write_text(json.dumps({"status": "running", "phase": "exporting"}))
        with pytest.raises(AlreadyRunningError, match="snapshot job is running"):
            reset(project, "output")
        assert project.gguf_path().is_file()
    finally:
        job.kill()
        job.wait()


def test_a_stop_during_eval_ends_stopped_and_the_next_start_continues(project, run_cli):
    """Issue 18, item 7: whenever the stop lands in the eval stage — while it imports torch (the
    SIGTERM kills it before its handler is in), while it evaluates, or after it finished — the run
    ends "stopped", never "failed", and the next start evaluates again."""
    r = run_cli("start", "--project", str(project.root), "--only", "eval", "--force")
    assert r.returncode == 0, r.stderr
    driver = int(re.search(r"pid (\d+)", r.stdout).group(1))
    deadline = time.monotonic() + 120
    while read_pid_file(project.stage_pid) is None and time.monotonic() < deadline:
        time.sleep(0.05)                      # polling a file another process writes: no event to wait on
    # the stage is held still while the stop is sent, so the stop lands inside it however fast the eval
    # is (a demo eval can finish before the stop command has started): the SIGTERM waits for SIGCONT
    stage = psutil.Process(read_pid_file(project.stage_pid)["pid"])
    stage.suspend()
    try:
        r = run_cli("stop", "--project", str(project.root), "--timeout", "0")
    finally:
        stage.resume()
    assert r.returncode == 0, r.stderr
    wait_exit(driver)
    state = json.loads(project.state_json.read_text())
    assert state["status"] == "stopped" and not state.get("error"), state
    project.stop_file.unlink(missing_ok=True)
    r = run_cli("run", "--project", str(project.root), "--only", "eval", "--force")
    assert r.returncode == 0, r.stderr
    assert json.loads(project.state_json.read_text())["status"] == "done"
