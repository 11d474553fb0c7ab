"""The demo exports' fingerprints: for every demo pack, build the demo, run the whole pipeline in a
fresh `gguf-trainer run` process, and hash what it exported (the adapter GGUF, the pack's extra
outputs) and eval.json without its clock fields (`time`, `seconds`) and the paths it names.

    PYTHONPATH=. python bench/demo_hashes.py [--pack ID ...] [--set KEY=VALUE ...] [--keep DIR]

`--set` changes the demo's settings before the run (tests/test_demo_hashes.py records the figures
of `--set train.steps=60`, the runs tests/demo_cache.py shares). The last stdout line is JSON:
{"capability", "torch", "settings", "packs": {id: {"gguf", "extras", "eval", "wall_s"}}}. A refactor that must not change behaviour compares this before and after;
tests/test_demo_hashes.py keeps the recorded figures (tests/data/demo_hashes.json) and computes the same
fingerprints (tests/demo_fingerprint.py).
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

from demo_fingerprint import fingerprint  # noqa: E402


def main() -> None:
    import torch

    from trainer_core.packs import DEMO_PACKS, get_pack
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", nargs="*", default=list(DEMO_PACKS))
    parser.add_argument("--set", nargs="*", default=[], dest="settings", metavar="KEY=VALUE",
                        help="settings applied to each demo before its run")
    parser.add_argument("--keep", default=None, help="build the projects under this folder and keep them")
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
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                      "settings": list(args.settings), "packs": packs}))


if __name__ == "__main__":
    main()
