"""Write tests/data/engine_ming_images.json: the Ming-Image facts computed by ggk's own code.

    python bench/engine_ming_fixture.py [--engine DIR] [--build DIR] [--out FILE]

The engine functions are taken from the unpacked ggk 0.9.7 sdist (`--engine`, default
/tmp/ggk-sdist/ggk-0.9.7, or $GGK_SDIST) unchanged and compiled behind
bench/engine_driver/ming_image.cpp with g++ (a few seconds); what is cut out and recorded:
bench/engine/ming_fixture.py. The tests never run this: they read the file it writes.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import ming_fixture  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=Path(os.environ.get("GGK_SDIST", "/tmp/ggk-sdist/ggk-0.9.7")))
    parser.add_argument("--build", type=Path, default=None, help="where the driver is built (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=ming_fixture.OUT)
    args = parser.parse_args()
    print("wrote " + ming_fixture.write_fixture(args.engine, args.build, args.out))


if __name__ == "__main__":
    main()
