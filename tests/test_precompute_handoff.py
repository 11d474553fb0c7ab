"""Both precompute splits in one stage process: the driver passes `--then train` and the process hands
over to precompute_train with the student and the teacher still loaded; each stage keeps its own
entry, events and outcome."""
from __future__ import annotations

import json
from pathlib import Path

from conftest import cli
from trainer_core.base.events import EventTailer


def _stage_events(root: Path, stage: str) -> list[dict]:
    return [e for e in EventTailer(root / "events.jsonl").read() if e["stage"] == stage]


def test_the_train_split_runs_in_the_val_splits_process(tmp_path):
    root = tmp_path / "t5_adapter"
    assert cli("demo", "--project", str(root)).returncode == 0
    r = cli("run", "--project", str(root), "--only", "corpus", "precompute_val", "precompute_train", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    state = json.loads((root / "state.json").read_text())
    val, train = state["stages"]["precompute_val"], state["stages"]["precompute_train"]
    assert val["status"] == "done" and train["status"] == "done" and not train.get("skipped")
    assert val["finished"] <= train["started"]
    running = {stage: [e["payload"]["pid"] for e in _stage_events(root, stage)
                       if e["type"] == "status" and e["payload"].get("status") == "running"]
               for stage in ("precompute_val", "precompute_train")}
    assert running["precompute_val"] == running["precompute_train"] and len(running["precompute_val"]) == 1
    # the models were loaded once: one "student:" line, in the val stage
    loads = [e for stage in ("precompute_val", "precompute_train") for e in _stage_events(root, stage)
             if e["type"] == "log" and str(e["payload"].get("message", "")).startswith("student:")]
    assert len(loads) == 1 and loads[0]["stage"] == "precompute_val"
    train_shards = [e for e in _stage_events(root, "precompute_train") if e["type"] == "artifact"]
    assert len(train_shards) == 3 and all(e["payload"]["kind"] == "shard_train" for e in train_shards)
    assert "in the same process" in (root / "pipeline.log").read_text()


def test_only_the_val_split_runs_alone(tmp_path):
    root = tmp_path / "t5_adapter"
    assert cli("demo", "--project", str(root)).returncode == 0
    r = cli("run", "--project", str(root), "--only", "corpus", "precompute_val", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    state = json.loads((root / "state.json").read_text())
    assert state["stages"]["precompute_val"]["status"] == "done" and "precompute_train" not in state["stages"]
    assert not list((root / "shards").glob("train/*.safetensors"))
    # then the train split in its own process, loading the models itself
    r = cli("run", "--project", str(root), "--only", "precompute_train", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    loads = [e for e in _stage_events(root, "precompute_train")
             if e["type"] == "log" and str(e["payload"].get("message", "")).startswith("student:")]
    assert len(loads) == 1
