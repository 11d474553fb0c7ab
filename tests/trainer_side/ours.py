"""One export through `gguf-trainer infer --prompt`'s path, and the fingerprints the engine fixture keeps of
a block of rows."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trainer_core.packs.lookup import engine_ids, resolve_material

__all__ = ["FIXTURE", "TOLERANCE", "PIXEL_TOLERANCE", "Ours", "fingerprint", "fingerprint_rel"]

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "engine_rows.json"   # bench/engine_check.py --write-fixture
TOLERANCE = 1e-4                # max |engine − ours| / max |ours|
PIXEL_TOLERANCE = 1e-6          # the pixels a tower reads (Qwen-Image 2.1 dumps them): float rounding


def fingerprint(rows: np.ndarray) -> dict:
    """What tests/data/engine_rows.json keeps of the engine's rows [n, width]: each row projected on two seeded unit
    vectors, and its max |value| (the full rows of ten packs would be megabytes)."""
    basis = np.random.default_rng(0).standard_normal((rows.shape[1], 2))
    basis /= np.linalg.norm(basis, axis=0, keepdims=True)
    return {"shape": list(rows.shape), "proj": (rows.astype(np.float64) @ basis).round(7).tolist(),
            "maxabs": np.abs(rows).max(axis=1).astype(np.float64).round(7).tolist()}


def fingerprint_rel(ours: np.ndarray, engine: dict) -> float:
    """The largest projection or max-abs gap between `ours` and a fingerprint, over max |ours|. A gap spread over a
    row shows at about its L2 size; a single wrong element e at about e / sqrt(width) (the basis is random)."""
    if list(ours.shape) != engine["shape"]:
        return float("inf")
    mine = fingerprint(ours)
    gap = max(np.abs(np.array(mine["proj"]) - np.array(engine["proj"])).max(),
              np.abs(np.array(mine["maxabs"]) - np.array(engine["maxabs"])).max())
    return float(gap / max(np.abs(ours).max(), 1e-30))


class Ours:
    """The trainer's side of one export: `gguf-trainer infer --prompt`'s path."""

    def __init__(self, project_dir: Path) -> None:
        from trainer_core.contract.gguf_io import read_adapter_gguf
        from trainer_core.contract.student import load_student
        from trainer_core.project import Project
        self.project = Project.open(project_dir)
        self.pack = self.project.pack
        if self.pack.engine is None:
            raise ValueError(f"the {self.pack.id} pack declares no engine facts (TrainerPack.engine): the engine "
                             "check does not know which conditioner runs its adapter")
        self.student_gguf = resolve_material(self.project, "student")
        self.student = load_student(self.student_gguf, resolve_material(self.project, "student_tokenizer"))
        self.adapter_path = self.project.gguf_path()
        self.adapter = read_adapter_gguf(self.adapter_path)
        self.seeded = "--t5-ids" in self.adapter.config.spec.infer_options     # the engine seeds it with T5 ids

    def predict(self, text: str, version: str) -> dict[str, Any]:
        """The student's rows, the adapter's rows and the ids of `text` as `version`'s conditioner runs them."""
        from trainer_core.infer import run_adapter
        hidden = self.pack.student_states(self.student, text)
        derived = self.pack.prompt_inputs(self.project, self.adapter_path, text, None)
        t5_ids = derived.get("--t5-ids")          # a seeded pack: the window from the project's T5 tokenizer
        out = run_adapter(self.adapter, hidden, t5_ids, seed_ids=derived.get("--seed-ids"),
                          bank=version in self.pack.engine.bank_versions, empty_prompt=text == "")
        return {"hidden": hidden, "rows": out, "ids": engine_ids(self.pack, self.student, text),
                "t5_ids": t5_ids, "seed_ids": derived.get("--seed-ids")}
