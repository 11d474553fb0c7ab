"""The demo exports' fingerprints: for every demo pack, build the demo, run the whole pipeline in a
fresh `gguf-trainer run` process, and hash what it exported (the adapter GGUF, the pack's extra
outputs) and eval.json without its clock fields (`time`, `seconds`) and the paths it names.

    PYTHONPATH=. python bench/demo_hashes.py [--pack ID ...] [--set KEY=VALUE ...] [--keep DIR] [--write]

`--set` changes the demo's settings before the run (the conformance suite holds the runs tests/demo_cache.py
shares, `--set train.steps=60`, to the recorded figures). The last stdout line is JSON:
{"machine": {"capability", "torch", "float_probe"}, "settings", "packs": {id: {"gguf", "extras", "eval", "wall_s"}}}.
A refactor that must not change behaviour compares this before and after. `--write` records it for this machine
in tests/data/demo_hashes_machines.json (replacing this machine's record; run it on the commit before a
change): float results, and so the bytes, depend on the CPU and the torch build (tests/demo_fingerprint.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))         # the fingerprints are the test's (bench imports tests, never the reverse)

from demo_fingerprint import BY_MACHINE, fingerprint, machine  # noqa: E402


def main() -> None:
    from trainer_core.packs import DEMO_PACKS, get_pack
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", nargs="*", default=list(DEMO_PACKS))
    parser.add_argument("--set", nargs="*", default=[], dest="settings", metavar="KEY=VALUE",
                        help="settings applied to each demo before its run")
    parser.add_argument("--keep", default=None, help="build the projects under this folder and keep them")
    parser.add_argument("--write", action="store_true", help=f"record the figures for this machine in {BY_MACHINE}")
    args = parser.parse_args()
    top = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="demo-hashes-"))
    env = {**os.environ, "GGUF_TRAINER_HOME": str(top / "home"), "PYTHONPATH": str(ROOT)}
    packs = {}
    for pack_id in args.pack:
        folder = top / pack_id / get_pack(pack_id).default_folder     # the name the GUI and the tests give it
        started = time.monotonic()
        setting = ["set", "--project", str(folder), *(x for s in args.settings for x in ("--set", s))]
        for argv in (["demo", "--pack", pack_id, "--project", str(folder)], *([setting] if args.settings else []),
                     ["run", "--project", str(folder)]):
            subprocess.run([sys.executable, "-m", "trainer_core", *argv], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        packs[pack_id] = {**fingerprint(folder), "wall_s": round(time.monotonic() - started, 1)}
        print(pack_id, json.dumps(packs[pack_id]), file=sys.stderr, flush=True)
    result = {"machine": machine(), "settings": list(args.settings), "packs": packs}
    if args.write:
        _write(result)
    print(json.dumps(result))


def _write(result: dict) -> None:
    import platform
    import subprocess as sp

    from trainer_core.base.atomic import atomic_write_text
    commit = sp.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    record = {**result, "packs": {k: {f: v[f] for f in ("gguf", "extras", "eval")} for k, v in result["packs"].items()},
              "recorded": f"{time.strftime('%Y-%m-%d')}, bench/demo_hashes.py on commit {commit} ({cpu}, "
                          f"{os.cpu_count()} cores)"}
    known = json.loads(BY_MACHINE.read_text())
    known["records"] = [r for r in known["records"] if r["machine"] != record["machine"]] + [record]
    atomic_write_text(BY_MACHINE, json.dumps(known, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
