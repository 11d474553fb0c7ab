"""The Supervisor's readers: the metric series across a resume's truncation, downsampling,
and a per-process CPU reading that is real (the same handle sampled twice)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from trainer_core.base.hardware import ProcessWatch
from trainer_core.project import Project
from trainer_core.supervisor import LiveView, downsample


def test_downsample_keeps_the_ends_and_the_limit():
    points = [{"step": i} for i in range(20_000)]
    picked = downsample(points, 400)
    assert len(picked) <= 401 and picked[0]["step"] == 0 and picked[-1]["step"] == 19_999
    steps = [p["step"] for p in picked]
    assert steps == sorted(set(steps))
    assert downsample(points[:10], 400) == points[:10]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_the_chart_follows_the_series_and_restarts_when_a_resume_rewrites_it(tmp_path):
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    project.checkpoints_dir.mkdir(parents=True)
    metrics = project.checkpoints_dir / "metrics.jsonl"
    _write(metrics, [{"step": s, "loss": 1.0 / s, "cos": 0.1 * s} for s in (10, 20, 30)])
    view = LiveView(project.root)
    snap = view.snapshot()
    assert [p["step"] for p in snap["chart"] if p["series"] == "loss"] == [10, 20, 30]
    version = snap["chart_version"]
    with open(metrics, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": 40, "loss": 0.02, "cos": 4.0}) + "\n")
        f.write('{"step": 50, "loss"')                        # a line still being written
    view.refresh()
    snap = view.snapshot()
    assert [p["step"] for p in snap["chart"] if p["series"] == "loss"] == [10, 20, 30, 40]
    assert snap["chart_version"] > version
    # a resume from step 20 rewrites the file (atomic replace): the view starts over
    _write(tmp_path / "new.jsonl", [{"step": s, "loss": 0.5, "cos": 0.5} for s in (10, 20)])
    (tmp_path / "new.jsonl").replace(metrics)
    _write(project.checkpoints_dir / "val.jsonl", [{"step": 20, "val_cos": 0.7}])
    view.refresh()
    snap = view.snapshot()
    assert [p["step"] for p in snap["chart"] if p["series"] == "loss"] == [10, 20]
    assert [p["value"] for p in snap["chart"] if p["series"] == "val_cos"] == [0.7]
    assert snap["last_val"]["val_cos"] == 0.7


def test_process_cpu_is_measured_on_one_handle():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        watch = ProcessWatch()
        first = watch.read(busy.pid)
        assert first["pid"] == busy.pid and first["cpu_pct"] is None        # primed, not a fake 0
        time.sleep(0.5)                                                       # CPU % needs elapsed time
        second = watch.read(busy.pid)
        assert second["cpu_pct"] > 20.0
    finally:
        busy.kill()
        busy.wait()
    assert watch.read(busy.pid) is None


def test_a_stage_over_several_ranks_shows_each_ranks_progress():
    from trainer_core.supervisor import merge_progress
    from ui.common import stage_strip_html
    progress: dict = {}
    merge_progress(progress, "precompute_train", {"count": 1, "total": 3, "unit": "shards", "rank": 0, "world": 2}, 1.0)
    merge_progress(progress, "precompute_train", {"count": 0, "total": 3, "unit": "shards", "rank": 1, "world": 2}, 2.0)
    merge_progress(progress, "precompute_train", {"count": 2, "total": 3, "unit": "shards", "rank": 0, "world": 2}, 3.0)
    assert {r: p["count"] for r, p in progress["precompute_train"]["ranks"].items()} == {0: 2, 1: 0}
    report = {"status": "running", "stages": [{"name": "precompute_train", "title": "Precompute (train)",
                                              "status": "running"}]}
    assert "rank 0 2/3 · rank 1 0/3" in stage_strip_html(report, progress)
    merge_progress(progress, "train", {"count": 5, "total": 10, "unit": "steps"}, 4.0)
    assert "ranks" not in progress["train"]


def test_a_report_read_earlier_never_replaces_a_later_one(tmp_path, monkeypatch):
    """The view's thread and the GUI's poke read the report at the same time: the reading that began first
    (before a Start, say) must not land over the one that began after it."""
    import threading

    import trainer_core.supervisor as supervisor
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    view = LiveView(project.root)
    real = supervisor.status_report
    first_reading, release = threading.Event(), threading.Event()
    calls = []

    def slow_then_fast(p):
        calls.append(len(calls))
        report = real(p)
        if len(calls) == 1:                  # the earlier reading: it saw "idle", and lands last
            first_reading.set()
            assert release.wait(30)
            return {**report, "status": "idle-before"}
        return {**report, "status": "running-after"}
    monkeypatch.setattr(supervisor, "status_report", slow_then_fast)
    earlier = threading.Thread(target=view._read_report)
    earlier.start()
    assert first_reading.wait(30)
    view._read_report()                      # began after the first: shown
    assert view.snapshot()["report"]["status"] == "running-after"
    release.set()
    earlier.join(30)
    assert view.snapshot()["report"]["status"] == "running-after"
    assert view.snapshot()["report"]["read_at"] > 0
