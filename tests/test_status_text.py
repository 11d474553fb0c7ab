"""`gguf-trainer status` reads as a table for a person (issue 56 item 9): no JSON, clock times instead of epoch
seconds, figures rounded; `--json` keeps the full report. The real CLI output of a finished, a failed and a
stopped project is checked where those projects are made (test_eval_guide, test_hardening3, gui tests)."""
from __future__ import annotations

import time

from trainer_core.status_text import duration, figure, status_lines


def _report(**stage_extra):
    stages = [{"name": "corpus", "title": "Corpus", "done": True, "status": "done"},
              {"name": "train", "title": "Train adapter", "done": False, "status": "running", **stage_extra},
              {"name": "export", "title": "Export GGUF", "done": False, "status": "stale",
               "detail": "from step 300; training goes on to 500", "why_not": 0.123456789}]
    return {"project": "/p", "pack": "some_pack", "name": "run1", "status": "running", "pid": 42, "stage_pid": 43,
            "stages": stages, "checkpoints": {"last": {"step": 93, "val_cos": 0.47610325614611312}, "best": None},
            "eval": None, "metric_names": [], "eval_mock": False, "eval_demo": False, "outputs": [
                {"name": "run1-f16.gguf", "size": 3 * 1024 * 1024, "path": "/o/run1-f16.gguf", "mtime": 0.0}],
            "snapshots": [{"step": 50, "planned_steps": 300, "checkpoint": "last", "val_cos": 0.41234567891234,
                           "path": "/o/run1-step50-f16.gguf", "eval": {"cos": 0.398765432198}}],
            "plan": [{"stage": "train", "planned_seconds": 130.4, "actual_seconds": 3725.0}],
            "snapshot_job": {"status": "idle"}, "ggk_command": "ggk diffuser engine -- --llm a.gguf", "error": None}


def test_the_status_is_a_table_with_clock_times_and_rounded_figures():
    now = time.time()
    started = now - 185
    lines = status_lines(_report(started=started, step=93, planned_steps=300, eta_s=4000.0, rate=12.345,
                                 val_cos=0.4761032561461131), None, now=now)
    out = "\n".join(lines)
    assert "{" not in out and "}" not in out
    assert lines[0] == "/p: running (pid 42)  [some_pack, run1]"
    header, train = lines[1], next(x for x in lines if x.strip().startswith("train"))
    # one column start per heading: the table lines up
    assert train.index("running") == header.index("status") and train.index("step 93") == header.index("progress")
    assert "step 93 / 300, 12.3/s, ETA 1 h 06 min" in train
    assert f"started {time.strftime('%H:%M:%S', time.localtime(started))} (3 min 05 s ago)" in train
    assert "val cos 0.4761" in train and "0.47610325" not in out and str(int(started)) not in out
    export = next(x for x in lines if x.strip().startswith("export"))
    assert "stale" in export and "from step 300; training goes on to 500" in export and "why not 0.1235" in export
    assert "  checkpoint last: step 93, val cos 0.4761" in lines
    assert "  output run1-f16.gguf  3.0 MB" in lines
    assert "  snapshot step 50 / 300 (last), val cos 0.4123, eval cos 0.3988: /o/run1-step50-f16.gguf" in lines
    assert "  planned vs actual: train 2 min 10 s / 1 h 02 min" in lines
    assert lines[-1] == "  use it: ggk diffuser engine -- --llm a.gguf"


def test_units_and_figures():
    assert [duration(s) for s in (None, -1, 0, 59.4, 60, 3599, 3600, 7440)] == \
        ["–", "–", "0 s", "59 s", "1 min 00 s", "59 min 59 s", "1 h 00 min", "2 h 04 min"]
    assert figure(0.123456) == "0.1235" and figure(3) == "3" and figure(None) == "–"


def test_a_counted_stage_and_a_failed_one():
    report = _report(count=7, total=20, unit="shards")
    report["stages"][1].update(status="failed", error="the disk is full")
    report["status"], report["error"] = "failed", "the disk is full"
    lines = status_lines(report, None, log_path="/p/logs/pipeline.log", now=time.time())
    train = next(x for x in lines if x.strip().startswith("train"))
    assert "7 / 20 shards" in train and "ETA" not in train and "error: the disk is full" in train
    assert lines[-1] == "  last error: the disk is full (see /p/logs/pipeline.log)"
