"""The collector policy of the stage processes (trainer_core/base/collector.py): paused while a `python -m
trainer_core.stages.X` process imports and loads, then frozen and collecting again; every other process left with
Python's default. Its speed is measured in bench/collector.py, not here."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

from conftest import REPO
from trainer_core.base import collector

# written by every Python process started with it on PYTHONPATH: what the collector looked like at the exit
_PROBE = """
import atexit, gc, json, os, sys
def _write():
    with open(os.environ["COLLECTOR_PROBE"], "a") as f:
        f.write(json.dumps({"argv0": sys.argv[0], "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}) + "\\n")
atexit.register(_write)
_exit = os._exit
def _exit_with_probe(code):
    _write()
    _exit(code)
os._exit = _exit_with_probe
"""


def test_a_stage_process_freezes_its_imports_and_collects_again_and_the_cli_is_left_alone(tmp_path):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(_PROBE, encoding="utf-8")
    out = tmp_path / "probe.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "probe"), str(REPO)]),
           "COLLECTOR_PROBE": str(out)}
    missing = tmp_path / "no-project"
    stage = subprocess.run([sys.executable, "-m", "trainer_core.stages.export", "--project", str(missing)],
                           capture_output=True, text=True, env=env, timeout=300)
    assert stage.returncode != 0 and "no-project" in stage.stdout + stage.stderr    # it ran, and said why
    cli = subprocess.run([sys.executable, "-m", "trainer_core", "status", "--project", str(missing)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert cli.returncode != 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    stage_row, cli_row = rows
    assert stage_row["argv0"].endswith("export.py") and stage_row["enabled"] and stage_row["frozen"] > 10_000   # the imports
    assert cli_row["enabled"] and cli_row["frozen"] == 0


def test_loading_pauses_then_freezes_only_in_a_stage_process(monkeypatch):
    assert gc.isenabled()
    with collector.loading():                    # this worker is no stage process: nothing changes
        assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(collector, "_stage_process", False)
    monkeypatch.setattr(sys, "argv", ["-m"])    # what Python sets while it locates a -m module
    try:
        collector.pause_for_imports()
        assert not gc.isenabled()
        collector.settle()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        gc.unfreeze()
        with collector.loading():
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()
