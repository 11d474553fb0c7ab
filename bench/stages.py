"""Wall time of every stage of a demo run, per pack, and the run's peak RSS.

    PYTHONPATH=. python bench/stages.py [--pack ID ...] [--steps N] [--rounds R]

For each pack (every demo pack by default) a demo project is built in a temp folder (`gguf-trainer
demo`), then `gguf-trainer run` runs the whole pipeline in a fresh process, `--rounds` times (the
shards, checkpoints and outputs are reset in between, the materials kept); a stage's time is its
started → finished span in state.json (the stage process's start-up included: that is what a
user waits for), the median over the rounds. Peak RSS is the largest of the run's processes
(ru_maxrss of the waited-for children). The load average before each round is recorded beside it,
since two cores shared with anything else move every figure. The last stdout line is JSON:
{"date", "machine", "load", pack_id: {stage: seconds, "total", "build", "peak_rss_mib"}}.

`--write` records each measured pack's build and run time in trainer_core/demo_times.json, the one source of the
demo's duration that the GUI, the CLI and the README state (tests/test_user_strings.py holds the README to it);
it refuses on a machine whose load average is 0.5 or more before the first round (not idle: the figure would
say more about the load than about the demo).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STAGES = ("corpus", "precompute_val", "precompute_train", "train", "export", "eval")


def _cli(*args: str) -> subprocess.CompletedProcess:
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-m", "trainer_core", *args], env=env, capture_output=True, text=True)


def _run(project: Path) -> tuple[dict[str, float], float]:
    """One `gguf-trainer run`: (seconds per stage from state.json, peak RSS MiB of its processes)."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core", "run", "--project", str(project)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"gguf-trainer run failed on {project}: {proc.stderr.read()[-2000:]}")
    wall = time.monotonic() - started
    stages = json.loads((project / "state.json").read_text())["stages"]
    seconds = {name: round(stages[name]["finished"] - stages[name]["started"], 2) for name in STAGES}
    seconds["total"] = round(wall, 2)
    # wait4's ru_maxrss is the largest of the driver and the stage processes it waited for
    return seconds, usage.ru_maxrss / 1024


def measure(pack: str, steps: int, rounds: int, tmp: Path) -> dict[str, float]:
    project = tmp / pack
    started = time.monotonic()
    r = _cli("demo", "--project", str(project), "--pack", pack)
    build = round(time.monotonic() - started, 2)
    if r.returncode:
        raise SystemExit(f"gguf-trainer demo --pack {pack} failed: {r.stderr[-2000:]}")
    if steps:
        _cli("set", "--project", str(project), "--set", f"train.steps={steps}")
    runs, peaks, loads = [], [], []
    for _ in range(rounds):
        for sub in ("data", "shards", "checkpoints"):
            shutil.rmtree(project / sub, ignore_errors=True)
        for name in ("state.json", "eval.json", "seed_table.pt", "vision_proj.pt"):
            (project / name).unlink(missing_ok=True)
        loads.append(os.getloadavg()[0])
        seconds, peak = _run(project)
        runs.append(seconds)
        peaks.append(peak)
        print(f"{pack}: {seconds} peak {peak:.0f} MiB (load {loads[-1]:.2f})", file=sys.stderr, flush=True)
    out = {k: round(statistics.median(r[k] for r in runs), 2) for k in (*STAGES, "total")}
    out.update(build=build, peak_rss_mib=round(max(peaks), 1), load_before=[round(x, 2) for x in loads])
    return out


def write_times(figures: dict[str, Any], path: Path) -> None:
    """Merge the measured packs into demo_times.json (the packs not measured now keep their figures only when
    measured on the same date and machine; otherwise the file holds this run's packs alone)."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    machine = f"{os.cpu_count()} idle CPU cores ({platform.machine()})"
    date = figures["date"][:10]
    packs = old.get("packs", {}) if old.get("machine") == machine and old.get("measured") == date else {}
    for pack, f in figures.items():
        if isinstance(f, dict):
            packs[pack] = {"build_s": f["build"], "run_s": f["total"]}
    data = {"about": old.get("about", "How long each demo takes (bench/stages.py --write)."), "measured": date,
            "machine": machine, "packs": dict(sorted(packs.items()))}
    from trainer_core.base.atomic import atomic_write_text
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def main() -> int:
    from trainer_core.packs import DEMO_PACKS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", nargs="*", default=list(DEMO_PACKS), choices=DEMO_PACKS)
    parser.add_argument("--steps", type=int, default=0, help="train.steps (default: the demo's)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--write", action="store_true", help="record build and run times in trainer_core/demo_times.json")
    args = parser.parse_args()
    if args.write and (os.getloadavg()[0] >= 0.5 or args.steps):
        raise SystemExit("--write records the demo as users run it on an idle machine: the load average is "
                         f"{os.getloadavg()[0]:.2f} (wait for 0.5 or less), and --steps must be left out.")
    figures: dict[str, object] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                  "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
                                  "load": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as tmp:
        os.environ["GGUF_TRAINER_HOME"] = str(Path(tmp) / "home")      # keep the user's last project
        for pack in args.pack:
            figures[pack] = measure(pack, args.steps, args.rounds, Path(tmp))
    if args.write:
        write_times(figures, Path(__file__).resolve().parents[1] / "trainer_core" / "demo_times.json")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
