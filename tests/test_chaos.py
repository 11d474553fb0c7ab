"""Issue 18's chaos test: kill -9 the whole run (driver and stage) at random points in every stage of
a demo run, start it again each time, and the final GGUF is bit-identical to an uninterrupted run's.

The kill points are drawn from a seeded generator: a stage to hit (every stage at least once,
training three times) and a delay after that stage's own "running" event, which the test waits
for in events.jsonl (an event, not a guess at how long the earlier stages take).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli

pytestmark = pytest.mark.slow

STAGES = ("corpus", "precompute_val", "precompute_train", "precompute_train", "train", "train", "train",
          "export", "eval")
SETTINGS = ("train.steps=60", "train.val_every=20", "train.save_every=10", "train.log_every=5")


def _running_since(events: Path, offset: int, stage: str) -> bool:
    """Whether `stage` reported "running" in events.jsonl after byte `offset`."""
    try:
        with open(events, "rb") as f:
            f.seek(offset)
            lines = f.read().splitlines()
    except FileNotFoundError:
        return False
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("stage") == stage and event.get("type") == "status" \
                and event.get("payload", {}).get("status") == "running":
            return True
    return False


def _kill_during(root: Path, stage: str, delay: float, timeout: float = 300) -> str:
    """Start `run`, wait for `stage` to start, let it work `delay` seconds, kill -9 the process group.
    Returns what happened: "killed", or "finished" when the run ended first."""
    events = root / "events.jsonl"
    offset = events.stat().st_size if events.exists() else 0
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core", "run", "--project", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return "finished"
            if _running_since(events, offset, stage):
                break
            time.sleep(0.05)                       # polling a file another process appends to
        else:
            raise AssertionError(f"{stage} did not start within {timeout} s")
        if _wait(proc, delay):
            return "finished"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "killed"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait(proc: subprocess.Popen, seconds: float) -> bool:
    """True when the process ended within `seconds` (it is then not killed)."""
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_kill_9_anywhere_then_resume_gives_the_same_gguf(tmp_path):
    template = tmp_path / "template" / "t5_adapter"
    assert cli("demo", "--project", str(template)).returncode == 0
    assert cli("set", "--project", str(template), *(x for s in SETTINGS for x in ("--set", s))).returncode == 0

    reference = Path(shutil.copytree(template, tmp_path / "reference" / "t5_adapter"))
    r = cli("run", "--project", str(reference), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    want = (reference.parent / "pig_t5_adapter-f16.gguf").read_bytes()

    chaos = Path(shutil.copytree(template, tmp_path / "chaos" / "t5_adapter"))
    rng = random.Random(20261201)
    outcomes = []
    for stage in STAGES:
        outcomes.append((stage, _kill_during(chaos, stage, rng.uniform(0.2, 2.5))))
    killed = [o for o in outcomes if o[1] == "killed"]
    assert len(killed) >= 8, outcomes
    assert {s for s, _ in killed} >= {"precompute_val", "precompute_train", "train", "export"}, outcomes

    r = cli("run", "--project", str(chaos), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = (chaos.parent / "pig_t5_adapter-f16.gguf").read_bytes()
    assert got == want, f"the resumed GGUF differs from the uninterrupted one after {outcomes}"
    status = json.loads(cli("status", "--project", str(chaos), "--json").stdout)
    assert status["status"] == "done"
    assert not list(chaos.rglob("*.tmp")) and not list(chaos.parent.glob(".*.tmp"))
