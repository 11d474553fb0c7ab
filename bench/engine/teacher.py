"""The teacher path: for a pack whose teacher the engine runs as --llm (`EngineFacts.teacher`), the engine's
conditioner of each of its versions on a tiny teacher of that architecture (trainer_side.teacher), no adapter,
against the targets the pack's own teacher gives on the same weights: the ids and max |engine − ours| /
max |ours| over every row the engine takes (llm_hidden.bin).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from trainer_side.ours import TOLERANCE, fingerprint
from trainer_side.teacher import PROMPTS, pack_teacher, predict_teacher

from .driver import int_lines, rows, run_engine

__all__ = ["check_teacher"]


class _TeacherOnly:
    """What run_engine reads of an Ours, for the teacher as --llm and no adapter."""

    def __init__(self, ours: Any, gguf: Path) -> None:
        self.student_gguf, self.adapter_path, self.seeded = gguf, None, False
        self.pack, self.project = ours.pack, ours.project


def check_teacher(driver: Path, ours: Any, version: str, work: Path, fixture: list | None = None) -> dict:
    """PROMPTS through `version`'s teacher path and the pack's teacher: {"prompts", "teacher_max_rel", "ids_equal",
    "problems"}; with `fixture` (a list), also the engine's ids and row fingerprints of each."""
    teacher, gguf = pack_teacher(ours, work)
    answers = run_engine(driver, _TeacherOnly(ours, gguf), version, list(PROMPTS), work / "dumps")
    out = {"prompts": len(PROMPTS), "teacher_max_rel": 0.0, "ids_equal": True, "problems": []}
    for text, answer in zip(PROMPTS, answers):
        dump = answer["dump"]
        mine, engine_ids = predict_teacher(ours, teacher, text)
        if not (dump / "llm_hidden.bin").exists():
            out["problems"].append(f"{version} {text[:40]!r}: the engine wrote no teacher rows "
                                   f"({answer.get('engine_abort') or answer.get('error')})")
            out["ids_equal"] = False
            continue
        got = rows(dump / "llm_hidden.bin", mine.shape[1])
        got = got[:mine.shape[0]]          # ids padded to a multiple (EngineFacts.pad_multiple): the pads' rows are alike
        rel = (float(np.abs(got - mine).max() / max(np.abs(mine).max(), 1e-30)) if got.shape == mine.shape
               else float("inf"))
        out["teacher_max_rel"] = max(out["teacher_max_rel"], rel)
        seen = int_lines(dump / "tokens.txt")
        if seen != engine_ids:
            out["ids_equal"] = False
            out["problems"].append(f"{version} {text[:40]!r}: the engine's ids differ from the template's")
        if rel > TOLERANCE:
            out["problems"].append(f"{version} {text[:40]!r}: teacher rows {got.shape} vs {mine.shape}, "
                                   f"max_rel {rel:.3g}")
        if fixture is not None:
            fixture.append({"prompt": text, "ids": seen, "teacher": fingerprint(got)})
    return out
