"""The default plan (no calibration) against the run it plans, per demo pack.

    PYTHONPATH=. python bench/plan_accuracy.py [--pack ID ...] [--steps N]

For each pack (every demo pack by default) a demo project is built in a temp folder (`gguf-trainer
demo`), `--steps` set when given; the plan is made as `gguf-trainer plan` makes it before a run
(`make_plan`, no calibration.json), then `gguf-trainer run` runs the whole pipeline in a fresh
process. Measured: the run's wall time, the bytes it left on disk (the project folder and the output
folder beside it, after minus before) and the peak RSS of its largest process (VmHWM of the driver and
each stage process, procs.wait_peak_rss). Ratios are planned ÷ measured; the issue's bounds are
0.5–2 for time and RSS and 0.5–1.5 for bytes. Each pack's figures go to stderr with the load average
before its run (two shared cores move the seconds); the last stdout line is JSON:
{"date", "machine", pack_id: {"time_ratio", "disk_ratio", "rss_ratio", planned and measured figures}}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer_core", *args], env=_env(), capture_output=True, text=True)


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _run(project: Path) -> tuple[float, int]:
    """One `gguf-trainer run`: (wall seconds, peak RSS bytes of its largest process)."""
    from trainer_core.base.procs import wait_peak_rss
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core", "run", "--project", str(project)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = wait_peak_rss(proc)
    if proc.returncode != 0:
        raise SystemExit(f"gguf-trainer run failed on {project}: {proc.stderr.read()[-2000:]}")
    return time.monotonic() - started, peak


def measure(pack: str, steps: int, tmp: Path) -> dict[str, float]:
    project = tmp / pack / "project"
    r = _cli("demo", "--project", str(project), "--pack", pack)
    if r.returncode:
        raise SystemExit(f"gguf-trainer demo --pack {pack} failed: {r.stderr[-2000:]}")
    if steps:
        _cli("set", "--project", str(project), "--set", f"train.steps={steps}")
    plan = json.loads(_cli("plan", "--project", str(project), "--json").stdout)
    assert not plan["calibrated"], "a demo project has no calibration"
    before, load = _tree_bytes(project.parent), os.getloadavg()[0]
    wall, rss = _run(project)
    written = _tree_bytes(project.parent) - before
    out = {"time_ratio": round(plan["total_seconds"] / wall, 2), "disk_ratio": round(plan["total_disk_bytes"] / written, 2),
           "rss_ratio": round(plan["peak_ram_bytes"] / rss, 2),
           "planned_s": plan["total_seconds"], "run_s": round(wall, 1),
           "planned_bytes": plan["total_disk_bytes"], "written_bytes": written,
           "planned_rss_mib": round(plan["peak_ram_bytes"] / 2**20), "peak_rss_mib": round(rss / 2**20),
           "load_before": round(load, 2)}
    print(f"{pack}: {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def main() -> int:
    from trainer_core.packs import DEMO_PACKS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", nargs="*", default=list(DEMO_PACKS), choices=DEMO_PACKS)
    parser.add_argument("--steps", type=int, default=0, help="train.steps (default: the demo's)")
    args = parser.parse_args()
    figures: dict[str, object] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                  "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}"}
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        os.environ["GGUF_TRAINER_HOME"] = str(Path(tmp) / "home")      # keep the user's last project
        for pack in args.pack:
            figures[pack] = measure(pack, args.steps, Path(tmp))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
