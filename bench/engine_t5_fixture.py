"""Write tests/data/engine_t5_windows.json: PixArt T5 windows computed by ggk's own tokenizer.

    python bench/engine_t5_fixture.py [--driver PATH] [--out FILE]

Needs `ggk_tok`, the driver that compiles ggk 0.9.7's tokenizer sources unchanged
(bench/engine_driver/build.sh builds it from the engine's sdist; default path
/tmp/ggk/driver/ggk_tok, or $GGK_TOK). The tests never run it: they read the file this writes.
What it records and how: bench/engine/t5_fixture.py.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import t5_fixture  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", default=os.environ.get("GGK_TOK", "/tmp/ggk/driver/ggk_tok"))
    parser.add_argument("--out", type=Path, default=t5_fixture.OUT)
    args = parser.parse_args()
    print(f"wrote {t5_fixture.write_fixture(args.driver, args.out)} windows to {args.out}")


if __name__ == "__main__":
    main()
