"""The stage processes' collector policy (trainer_core/base/collector.py) against Python's default, side by side.

Each demo pack is built once; every round then runs its two stage chains (corpus → precompute, then train →
export → eval) twice on fresh copies, interleaved: once as the driver starts them (`python -m
trainer_core.stages.X`: the collector paused while importing and loading, then frozen) and once through runpy from
`python -c` (the same code, but Python's default collector: the policy only acts in a `-m` process). Per run:
the CPU seconds of both processes (user + system) and the export's sha256, which must be the same bytes.

    PYTHONPATH=. python bench/collector.py [--pack ID ...] [--rounds R]

One torch thread per process (as the tests run), so the figures are CPU time, not how the cores were shared.
The last stdout line is JSON.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "tests"))         # the driver's chains are the demo cache's (bench imports tests, never the reverse)

from demo_cache import stage_chains  # noqa: E402


def _cpu_of(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} failed in {cwd}: {done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _run(project: Path, policy: bool, env: dict[str, str]) -> tuple[float, str]:
    cpu = 0.0
    for first, *then in stage_chains():
        module = first.module
        args = ["--project", str(project), *first.args, *(["--then", *(spec.name for spec in then)] if then else [])]
        if policy:
            argv = [sys.executable, "-m", module, *args]
        else:
            code = (f"import runpy, sys; sys.argv = [{module!r}, *sys.argv[1:]]; "
                    f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
            argv = [sys.executable, "-c", code, *args]
        cpu += _cpu_of(argv, project, env)
    export = sorted(project.parent.glob("*-f16.gguf"))
    if len(export) != 1:
        sys.exit(f"{project}: expected one export beside the project, found {[p.name for p in export]}")
    return cpu, hashlib.sha256(export[0].read_bytes()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from trainer_core.packs import DEMO_PACKS
    ap.add_argument("--pack", nargs="+", default=[DEMO_PACKS[0]], choices=DEMO_PACKS,
                    help=f"the demo packs measured (default: the first demo, {DEMO_PACKS[0]})")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="collector-bench-") as tmp:
        top = Path(tmp)
        env["GGUF_TRAINER_CACHE"] = str(top / "cache")
        for pack in args.pack:
            template = top / f"{pack}-built" / "demo"
            build = ("import sys; from trainer_core.demo import build_demo; "
                     "build_demo(sys.argv[1], sys.argv[2]).update_settings(['train.steps=60'])")
            subprocess.run([sys.executable, "-c", build, str(template), pack], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            figures: dict[str, list] = {"policy_cpu_s": [], "default_cpu_s": [], "exports": []}
            for r in range(args.rounds):
                for policy in ((True, False) if r % 2 == 0 else (False, True)):
                    where = top / f"{pack}-{r}-{'policy' if policy else 'default'}"
                    shutil.copytree(template.parent, where)
                    cpu, digest = _run(where / "demo", policy, env)
                    figures["policy_cpu_s" if policy else "default_cpu_s"].append(round(cpu, 2))
                    figures["exports"].append(digest)
                    shutil.rmtree(where)
            policy_s, default_s = statistics.median(figures["policy_cpu_s"]), statistics.median(figures["default_cpu_s"])
            out[pack] = {"policy_cpu_s": figures["policy_cpu_s"], "default_cpu_s": figures["default_cpu_s"],
                         "ratio": round(policy_s / default_s, 3), "saved_cpu_s": round(default_s - policy_s, 2),
                         "same_export": len(set(figures["exports"])) == 1}
            print(f"{pack}: policy {figures['policy_cpu_s']} default {figures['default_cpu_s']} CPU-s, "
                  f"ratio {out[pack]['ratio']}, same export {out[pack]['same_export']}", file=sys.stderr)
    print(json.dumps({"rounds": args.rounds, "packs": out}))
    return 0 if all(f["same_export"] for f in out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
