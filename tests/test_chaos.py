"""Issue 18's chaos test: kill -9 the whole run (driver and stage) at random points in every stage of
a demo run, start it again each time, and the final GGUF is bit-identical to an uninterrupted run's.

The kill points are drawn from a seeded generator: a stage to hit (every stage at least once,
training three times) and a delay after that stage's own "running" event, which the test waits
for in events.jsonl (an event, not a guess at how long the earlier stages take). The delay is a
fraction of how long that stage took in the test's own uninterrupted run, so a faster stage is
still hit inside its work; when a kill left the target stage done on disk (it was killed after
writing its last file), the next stage that runs is hit instead, so one early finish does not
let the whole run complete and turn every later kill into a miss.
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


ORDER = ("corpus", "precompute_val", "precompute_train", "train", "export", "eval")


def _events(path: Path, offset: int = 0) -> list[dict]:
    """The events appended to events.jsonl after byte `offset` (a line still being written is skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def _is_running(event: dict) -> bool:
    return event.get("type") == "status" and event.get("payload", {}).get("status") == "running"


def _durations(events: Path) -> dict[str, float]:
    """Seconds from each stage's "running" event to its last event, in an uninterrupted run."""
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for event in _events(events):
        stage = event.get("stage")
        if stage is None:
            continue
        if _is_running(event):
            start.setdefault(stage, event["time"])
        end[stage] = event["time"]
    return {stage: end[stage] - start[stage] for stage in start}


def _first_running_from(events: Path, offset: int, stage: str) -> str | None:
    """The first stage at or after `stage` (pipeline order) that reported "running" after `offset`."""
    wanted = ORDER[ORDER.index(stage):]
    for event in _events(events, offset):
        if event.get("stage") in wanted and _is_running(event):
            return event["stage"]
    return None


def _kill_during(root: Path, stage: str, fraction: float, durations: dict[str, float],
                 timeout: float = 300) -> tuple[str, str]:
    """Start `run`, wait for `stage` (or, when it is already done, the next stage that runs) to
    start, let it work `fraction` of its uninterrupted duration, kill -9 the process group.
    Returns (stage hit, what happened): "killed", or "finished" when the run ended first."""
    events = root / "events.jsonl"
    offset = events.stat().st_size if events.exists() else 0
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core", "run", "--project", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return stage, "finished"
            hit = _first_running_from(events, offset, stage)
            if hit is not None:
                break
            time.sleep(0.05)                       # polling a file another process appends to
        else:
            raise AssertionError(f"{stage} did not start within {timeout} s")
        if _wait(proc, fraction * durations[hit]):
            return hit, "finished"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return hit, "killed"
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
    durations = _durations(reference / "events.jsonl")
    assert set(durations) == set(ORDER), durations

    chaos = Path(shutil.copytree(template, tmp_path / "chaos" / "t5_adapter"))
    rng = random.Random(20261201)
    outcomes = []
    for stage in STAGES:
        outcomes.append(_kill_during(chaos, stage, rng.uniform(0.15, 0.75), durations))
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
