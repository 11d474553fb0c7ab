"""The engine harness: ggk 0.9.7's own code, built from its sdist, against the trainer's side.

Imports point one way, top to bottom (tests/test_bench_edges.py holds it, with no import cycle):

    check.py        one pack: its demo export, then text.py, vision.py and teacher.py; the JSON line
    text.py         the text path: every prompt through each model version's conditioner
    vision.py       the reference-image path, for the packs whose conditioner reads references
    teacher.py      the teacher path, for the packs whose teacher the engine runs as --llm
    tokenizer.py    the tokenizer check: the engine's tokenizer sources behind ggk_tok
    driver.py       the sdist, the ggk_cond build, a run of it, the readers of its dumps and logs
    t5_fixture.py   the tiny T5 handed to the engine as a tokenizer pack; tests/data/engine_t5_windows.json
    ming_fixture.py Ming's image rules cut out of the engine; tests/data/engine_ming_images.json

The trainer's side of every comparison (an export's infer path, the reference families, the tiny teachers,
the row fingerprints) is tests/trainer_side/, which the tests hold against the recorded rows; bench imports
it from there, the tests never import bench. Which path a pack gets is read from its declarations
(`TrainerPack.engine`), never from its id. The command lines are bench/engine_check.py,
bench/engine_tokenizer.py, bench/engine_t5_fixture.py and bench/engine_ming_fixture.py; the C++ drivers and
their build scripts are bench/engine_driver/.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRIVERS = REPO / "bench" / "engine_driver"
if str(REPO) not in sys.path:                  # this checkout's trainer_core, before an installed one
    sys.path.insert(0, str(REPO))
if str(REPO / "tests") not in sys.path:        # trainer_side, after everything else (tests/ holds other modules)
    sys.path.append(str(REPO / "tests"))
