"""The fingerprints of a demo run's exports: the adapter GGUF, the pack's extra outputs and eval.json without its
clock fields (`time`, `seconds`) and the paths it names. tests/test_demo_hashes.py holds the shared demo runs to
the recorded ones (tests/data/demo_hashes.json), which bench/demo_hashes.py records with these same functions."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

__all__ = ["VOLATILE", "sha256", "eval_fingerprint", "fingerprint"]

VOLATILE = ("time", "seconds", "gguf")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def eval_fingerprint(path: Path) -> str:
    """sha256 of eval.json without the fields that name the clock or the folder it ran in."""
    record = json.loads(path.read_text())
    for key in VOLATILE:
        record.pop(key, None)
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def fingerprint(project_dir: Path) -> dict:
    """{"gguf", "extras": {name: sha256}, "eval"} of the project's exports."""
    from trainer_core.project import Project
    project = Project.open(project_dir)
    return {"gguf": sha256(project.gguf_path()),
            "extras": {p.name: sha256(p) for p in project.pack.extras.outputs(project)},
            "eval": eval_fingerprint(project.eval_json)}
