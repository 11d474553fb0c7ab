"""The text path: every prompt through the conditioner of each model version that runs the pack's adapter
(`EngineFacts.versions`), against `gguf-trainer infer --prompt`'s path (trainer_side.ours.Ours).

Compared: max_rel (max |engine − ours| / max |ours| over every adapter output row, adapter_out.bin),
student_max_rel (the same over the student's rows, qwen_hidden.bin) and the ids the engine used (tokens.txt,
t5_ids.txt, seed_ids.txt, or the ids its conditioner logs).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from trainer_side.ours import TOLERANCE, fingerprint

from .driver import dumped_ids, int_lines, rows, run_engine

__all__ = ["FIXTURE_PROMPTS", "check_text"]

FIXTURE_PROMPTS = (0, 1, 2, 4, 5, 6, 7, 13)   # empty, plain, weighted, 120+ T5 tokens, German, Chinese, accents, emoji


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def check_text(driver: Path, ours: Any, prompts: list[str], work: Path, fixture: dict | None = None) -> dict:
    """{"max_rel", "student_max_rel", "ids_equal", "problems", "aborts"} over every prompt and version; with
    `fixture` (a dict), also the engine's ids and row fingerprints of the FIXTURE_PROMPTS, per version."""
    out: dict[str, Any] = {"max_rel": 0.0, "student_max_rel": 0.0, "ids_equal": True, "problems": [], "aborts": []}
    problems = out["problems"]
    for version in ours.pack.engine.versions:
        answers = run_engine(driver, ours, version, prompts, work)
        if len(answers) != len(prompts):
            raise SystemExit(f"the engine driver answered {len(answers)} of {len(prompts)} prompts on {version}")
        for index, (text, answer) in enumerate(zip(prompts, answers)):
            mine = ours.predict(text, version)
            dump = answer["dump"]
            if "engine_abort" in answer:         # the dumps were written before it; the DiT never gets the rows
                out["aborts"].append({"version": version, "prompt": text, "abort": answer["engine_abort"]})
            got = rows(dump / "adapter_out.bin", mine["rows"].shape[1])
            student = rows(dump / "qwen_hidden.bin", ours.adapter.config.in_dim)
            if got.shape != mine["rows"].shape or student.shape != mine["hidden"].shape:
                problems.append(f"{version} {text[:40]!r}: engine rows {got.shape} / student {student.shape}, "
                                f"ours {mine['rows'].shape} / {mine['hidden'].shape}")
                out["ids_equal"] = False
                continue
            rel, rel_s = _rel(got, mine["rows"]), _rel(student, mine["hidden"])
            out["max_rel"], out["student_max_rel"] = max(out["max_rel"], rel), max(out["student_max_rel"], rel_s)
            checks = {"ids": (dumped_ids(answer), mine["ids"])}
            if fixture is not None and index in FIXTURE_PROMPTS:
                entry = {"prompt": text, "rows": fingerprint(got), "student": fingerprint(student),
                         "ids": dumped_ids(answer)}
                for name in ("t5_ids", "seed_ids"):
                    if (dump / f"{name}.txt").exists():
                        entry[name] = int_lines(dump / f"{name}.txt")
                fixture.setdefault(version, []).append(entry)
            if (dump / "t5_ids.txt").exists():
                checks["t5_ids"] = (int_lines(dump / "t5_ids.txt"), list(mine["t5_ids"]))
            if (dump / "seed_ids.txt").exists() and mine["seed_ids"] is not None:
                checks["seed_ids"] = (int_lines(dump / "seed_ids.txt"), list(mine["seed_ids"]))
            for name, (engine, ours_ids) in checks.items():
                if engine is not None and engine != ours_ids:
                    out["ids_equal"] = False
                    problems.append(f"{version} {text[:40]!r}: {name} engine {engine[:24]} ours {ours_ids[:24]}")
            if rel > TOLERANCE:
                problems.append(f"{version} {text[:40]!r}: max_rel {rel:.3g} (student {rel_s:.3g})")
    return out
