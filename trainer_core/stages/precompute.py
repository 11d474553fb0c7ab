"""Precompute stage: corpus → shards of student states and teacher targets, one split per run.

    python -m trainer_core.stages.precompute --project DIR --split val|train

Shard i holds corpus lines [i·size, (i+1)·size). The student and the teacher are loaded once
per stage process, only when a shard is missing. A shard is written atomically, so a rerun
skips finished shards and a crash costs at most the shard in flight; a stop request is
honoured after that shard. Shards written under another contract are discarded first (see
shards.prepare_split).
"""
from __future__ import annotations

import collections
import sys
import time
from typing import Any, Callable

from ..errors import TrainerError
from ..events import Report
from ..project import Project
from ..shards import contract_for, expected_shards, mock_enabled, prepare_split, shard_path, write_shard
from .base import never, stage_main

__all__ = ["run", "load_models"]


def load_models(project: Project, report: Report) -> tuple[Any, Any, Any]:
    """(student, teacher, device), each loaded once for the stage."""
    pack, p = project.pack, project.settings.precompute
    gguf, snapshot = pack.require_material(project, "student"), pack.require_material(project, "student_tokenizer")
    from ..devices import pick_device   # torch and transformers load only once the files are known
    from ..student import load_student
    device = pick_device(p.device)
    dtype = p.student_dtype if device.type == "cuda" or p.student_dtype != "f16" else "f32"
    student = load_student(gguf, snapshot, device=device, dtype=dtype)
    report("log", level="info", message=f"student: hidden {student.hidden_size}, {dtype} on {device}")
    if mock_enabled(project):
        teacher = pack.build_mock_teacher(project)
        report("log", level="warning",
               message="MOCK teacher: synthetic targets — a smoke test of the machinery, never a usable adapter")
    else:
        teacher = pack.build_teacher(project, device)
        for note in getattr(teacher, "notes", ()):      # what loading had to repair or decide
            report("log", level="warning" if "rebuilt" in note else "info", message=note)
        report("log", level="info", message=f"teacher loaded ({getattr(teacher, 'mode', 'resident')} on {device})")
    return student, teacher, device


def run(project: Project, report: Report, should_stop: Callable[[], bool] = never,
        split: str = "train") -> str:
    pack = project.pack
    train_file, val_file = project.corpus_files()
    corpus = pack.read_samples(project, val_file if split == "val" else train_file)
    p = project.settings.precompute
    size = p.val_shard_size if split == "val" else p.shard_size
    total = expected_shards(project, split, len(corpus))
    prepare_split(project, split, lambda m: report("log", level="warning", message=m))
    missing = [i for i in range(total) if not shard_path(project, split, i).exists()]
    report("progress", count=total - len(missing), total=total, unit="shards",
           detail=f"{split}: {len(corpus)} prompts in {total} shards, {len(missing)} to compute")
    if not missing:
        return "done"
    if should_stop():
        return "stopped"
    student, teacher, device = load_models(project, report)
    session = pack.prepare(project, student, teacher, report)
    budgets = pack.budgets(project, device)
    rates: collections.deque[float] = collections.deque(maxlen=5)   # samples/s of the last shards
    done = total - len(missing)
    for n, index in enumerate(missing):
        if should_stop():
            report("log", level="info", message=f"stop requested: {done} of {total} {split} shards are on disk")
            return "stopped"
        prompts = corpus[index * size:(index + 1) * size]
        started = time.monotonic()
        try:
            tensors, extra = pack.make_shard(prompts, student, teacher, budgets, session)
        except TrainerError:
            raise
        except Exception as e:
            raise TrainerError(_shard_failure(split, index, e, done, total, pack.teacher_control)) from e
        meta = {"pack": pack.id, "kind": pack.adapter_kind, "contract": contract_for(project),
                "mock_teacher": mock_enabled(project), "teacher_mode": getattr(teacher, "mode", ""),
                "student": pack.resolve_material(project, "student").name, "split": split, "shard": index,
                "samples": len(prompts), "in_dim": int(tensors["q_pack"].shape[1]),
                "out_dim": int(tensors["t_pack"].shape[1]), "num_queries": extra.get("num_queries", 0),
                "storage": "bf16", **extra.get("meta", {})}
        path = shard_path(project, split, index)
        write_shard(path, tensors, meta, extra["prompts"])
        done += 1
        rates.append(len(prompts) / max(time.monotonic() - started, 1e-9))
        rate = sum(rates) / len(rates)
        left = sum(min(size, len(corpus) - i * size) for i in missing[n + 1:])
        report("artifact", path=str(path), kind=f"shard_{split}", samples=len(prompts),
               truncated_student=extra.get("truncated_student", 0),
               **{k: extra[k] for k in ("truncated_teacher",) if k in extra})
        report("progress", count=done, total=total, unit="shards", rate=round(rate, 2),
               eta_s=round(left / rate, 1), detail=f"{split} shard {index + 1}/{total} ({rate:.1f} prompts/s)")
    return "done"


def _shard_failure(split: str, index: int, error: Exception, done: int, total: int, control: str) -> str:
    kept = f"the {done} finished {split} shard(s) of {total} are kept"
    text = " ".join(str(error).split())
    if "out of memory" in text.lower():
        offload = ("a smaller precompute.gpu_mem_gib (more of the teacher in CPU RAM)" if control == "placement"
                   else "precompute.teacher_mode offload")
        return (f"Out of memory while computing {split} shard {index}; {kept}. Lower precompute.teacher_batch "
                f"or precompute.tok_budget, or use {offload}, then start again.")
    return f"The teacher or student failed on {split} shard {index} ({type(error).__name__}: {text}); {kept}."


if __name__ == "__main__":
    sys.exit(stage_main("precompute", run))
