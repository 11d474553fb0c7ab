"""Issue 18's chaos test: kill -9 the whole run (driver and stage) at random points in every stage of
a demo run, start it again each time, and the final GGUF is bit-identical to an uninterrupted run's.

The kill points are chosen, not many: every stage once, training twice (once early, before its
first checkpoint save, once late, between saves: save_every is 10 steps and the events come every 5,
so a share of its events lands on or next to a save), and export (the GGUF is being written); how
far into each stage is set near a chosen share (a seeded generator moves it a little), as a share of the events that stage wrote in the
test's own uninterrupted run: the test follows events.jsonl (events, not a guess at seconds, which
moved with the machine's load) and kills as soon as the stage has written that many after its
"running". A resumed stage writes fewer events than a fresh one, and a kill can leave its target
stage done on disk: whenever a later stage is already running, that one is hit instead, so one
early finish never lets the whole run complete and turn every later kill into a miss.
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

import demo_cache
from conftest import cli

STAGES = ("corpus", "precompute_val", "precompute_train", "train", "train", "export", "eval")
SHARES = (0.5, 0.5, 0.4, 0.1, 0.6, 0.3, 0.5)          # how far into each, of its uninterrupted event count
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


def _event_counts(events: Path) -> dict[str, int]:
    """How many events each stage wrote after its first "running" in an uninterrupted run."""
    counts: dict[str, int] = {}
    for event in _events(events):
        stage = event.get("stage")
        if stage is None:
            continue
        if stage in counts:
            counts[stage] += 1
        elif _is_running(event):
            counts[stage] = 0
    return counts


def _reached(events: list[dict], stage: str, want: int) -> str | None:
    """The stage to kill now: the first at or after `stage` that is running and has written `want`
    events since, or a later stage already running (the earlier one ended first); else None."""
    order = ORDER[ORDER.index(stage):]
    hit, seen = None, 0
    for event in events:
        name = event.get("stage")
        if name not in order:
            continue
        if hit is None:
            if _is_running(event):
                hit = name
            continue
        if name == hit:
            seen += 1
        elif _is_running(event) and order.index(name) > order.index(hit):
            return name
        if seen >= want:
            return hit
    return hit if hit is not None and seen >= want else None


def _kill_during(root: Path, stage: str, share: float, counts: dict[str, int],
                 timeout: float = 300) -> tuple[str, str]:
    """Start `run`, follow its events, kill -9 the process group once `stage` (or the next stage
    that runs) has written `share` of its uninterrupted event count. Returns (stage hit, what
    happened): "killed", or "finished" when the run ended first."""
    events = root / "events.jsonl"
    offset = events.stat().st_size if events.exists() else 0
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core", "run", "--project", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return stage, "finished"
            seen = _events(events, offset)
            hit = next((e["stage"] for e in seen if e.get("stage") in ORDER[ORDER.index(stage):]
                        and _is_running(e)), None)
            target = None if hit is None else _reached(seen, stage, int(share * counts[hit]))
            if target is not None:
                break
            time.sleep(0.02)                       # polling a file another process appends to
        else:
            raise AssertionError(f"{stage} did not start within {timeout} s")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return target, "killed"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_kill_9_anywhere_then_resume_gives_the_same_gguf(tmp_path):
    template = demo_cache.copy_built("t5xxl_pixart", tmp_path / "template")      # `gguf-trainer demo`'s project
    assert cli("set", "--project", str(template), *(x for s in SETTINGS for x in ("--set", s))).returncode == 0

    reference = Path(shutil.copytree(template, tmp_path / "reference" / template.name))
    r = cli("run", "--project", str(reference), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    want = (reference.parent / "pig_t5_adapter-f16.gguf").read_bytes()
    counts = _event_counts(reference / "events.jsonl")
    assert set(counts) == set(ORDER) and all(counts.values()), counts

    chaos = Path(shutil.copytree(template, tmp_path / "chaos" / template.name))
    rng = random.Random(20261201)
    outcomes = []
    for stage, share in zip(STAGES, SHARES):
        outcomes.append(_kill_during(chaos, stage, min(0.9, share + rng.uniform(-0.05, 0.05)), counts))
    killed = [o for o in outcomes if o[1] == "killed"]
    assert len(killed) >= 6, outcomes
    assert {s for s, _ in killed} >= {"precompute_val", "precompute_train", "train", "export"}, outcomes

    r = cli("run", "--project", str(chaos), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = (chaos.parent / "pig_t5_adapter-f16.gguf").read_bytes()
    assert got == want, f"the resumed GGUF differs from the uninterrupted one after {outcomes}"
    status = json.loads(cli("status", "--project", str(chaos), "--json").stdout)
    assert status["status"] == "done"
    assert not list(chaos.rglob("*.tmp")) and not list(chaos.parent.glob(".*.tmp"))
