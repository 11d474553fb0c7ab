"""Our token ids against the engine's own tokenizer code, compiled from the ggk 0.9.7 sdist.

    python bench/engine_tokenizer.py [--engine DIR] [--prompts FILE] [--write-fixture]

Downloads the ggk 0.9.7 sdist from PyPI (`pip download`, once, into ~/.cache/gguf-trainer) unless
--engine points at an unpacked one, compiles its tokenizer sources unchanged behind the small
driver in bench/engine_driver/ (g++; about 40 s on 2 cores), and feeds both the engine and
trainer_core every prompt of tests/data/engine_prompts.jsonl for every pack whose model version's prompt
assembly the driver transcribes (PixArt, LLaDA, MageFlow, Qwen-Image 2.1): the student ids as the engine
assembles them (text-to-image, and the edit samples of the packs that declare `engine.edit_tokens`), and
PixArt's 120-slot T5 windows (over the tiny T5's vocabulary handed to the engine as a tokenizer
pack, as bench/engine_t5_fixture.py does; the prompts of this table and of that fixture).
`--write-fixture` stores the engine's ids in tests/data/engine_tokens.json, which
tests/test_engine_tokens.py checks without a compiler. Needs no GPU; exits 0 with a note when
there is no C++ compiler. Ends with one JSON line: per pack {equal, total}, `t5_windows`
{equal, total}, and `all_equal`. The comparison itself: bench/engine/tokenizer.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import tokenizer  # noqa: E402
from engine.driver import VERSION, engine_source, missing_tools  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", help=f"an unpacked ggk-{VERSION} sdist (default: download it from PyPI)")
    parser.add_argument("--prompts", default=str(tokenizer.PROMPTS))
    parser.add_argument("--write-fixture", action="store_true", help=f"write the engine's ids to {tokenizer.FIXTURE}")
    args = parser.parse_args()
    if missing_tools():
        print("no C++ compiler: the engine comparison is skipped", file=sys.stderr)
        print(json.dumps({"skipped": "no C++ compiler"}))
        return 0
    print(json.dumps(tokenizer.check(engine_source(args.engine), Path(args.prompts), args.write_fixture)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
