"""Precompute stage: corpus → shards of student states and teacher targets, one split per run.

    python -m trainer_core.stages.precompute --project DIR --split val|train [--then precompute_train]

Shard i holds corpus lines [i·size, (i+1)·size). The student and the teacher are loaded once
per stage process, only when a shard is missing. When the driver chains both splits into one
process (`--then precompute_train`, see stages/base.py) the train split finds them, and the pack's
session, in the chain's `shared` dict: the second split pays no interpreter start, no imports and
no model loading. Under a launcher (torchrun, accelerate launch,
or RANK / WORLD_SIZE set by hand on several machines sharing the project) rank r computes the
shards whose index ≡ r (mod world size) and rank 0 waits until every shard is on disk; no
collective is used, so a failed rank only redoes its own shards. A shard is written atomically, so a rerun
skips finished shards and a crash costs at most the shard in flight; a stop request is
honoured after that shard. Shards written under another contract are discarded first (see
shards.prepare_split).
"""
from __future__ import annotations

import collections
import time
from typing import Any, Callable

from trainer_core.base import collector
from trainer_core.base.atomic import atomic_write_text
from trainer_core.contract.dist import Rank, wait_for
from trainer_core.contract.dist import current as current_rank
from trainer_core.base.errors import TrainerError
from trainer_core.base.events import Report
from trainer_core.project import Project
from trainer_core.contract.shards import (contract_for, expected_shards, mock_enabled, prepare_split, read_contract,
                                          remove_temps, shard_files, shard_path, write_shard)
from trainer_core.base.allocator import keep_large_blocks, needs_large_blocks
from trainer_core.stages.base import exit_process, never, stage_main
from trainer_core.packs.lookup import require_material, resolve_material

__all__ = ["run", "load_models", "large_block_batches"]


def load_models(project: Project, report: Report) -> tuple[Any, Any, Any]:
    """(student, teacher, device), each loaded once for the stage."""
    pack, p = project.pack, project.settings.precompute
    gguf, snapshot = require_material(project, "student"), require_material(project, "student_tokenizer")
    from trainer_core.contract.dist import rank_device     # torch and transformers load only once the files are known
    from trainer_core.contract.student import load_student
    device = rank_device(p.device, current_rank())
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


def large_block_batches(student: Any, budgets: Any, device: Any) -> bool:
    """Whether a CPU student batch at the token budget makes temporaries above glibc's mmap ceiling (its
    MLP's gate/up rows in bf16 or an RMSNorm's float32 rows), which would be mmapped and faulted in again
    at every batch (base/allocator.py; Qwen-Image at the peer geometry: 12,288 tokens × 3072 × 2 B = 75 MB)."""
    c = student.config
    per_token = max(2 * int(c.intermediate_size), 4 * int(c.hidden_size))
    return device.type == "cpu" and needs_large_blocks(budgets.student_tok_budget * per_token)


def run(project: Project, report: Report, should_stop: Callable[[], bool] = never,
        split: str = "train", shared: dict[str, Any] | None = None) -> str:
    # the models, loaded on the first missing shard; kept in the chain's dict for the other split
    loaded: list[tuple[Any, ...]] = (shared if shared is not None else {}).setdefault("precompute_models", [])
    return _run_split(project, report, should_stop, split, loaded)


def _models(project: Project, report: Report, loaded: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """(student, teacher, device, session, budgets), loaded and prepared once for both splits of a run."""
    if not loaded:
        with collector.loading():                   # they live as long as the process (base/collector.py)
            student, teacher, device = load_models(project, report)
        pack = project.pack
        budgets = pack.budgets(project, device)
        if large_block_batches(student, budgets, device) and keep_large_blocks():   # before prepare's fit
            report("log", level="info", message="CPU student batches above 32 MiB a tensor: freed memory stays "
                                                "in the heap (up to 1 GiB) instead of being unmapped at every batch")
        session = pack.prepare(project, student, teacher, report)
        loaded.append((student, teacher, device, session, budgets))
    return loaded[0]


def _run_split(project: Project, report: Report, should_stop: Callable[[], bool], split: str,
               loaded: list[tuple[Any, ...]]) -> str:
    pack = project.pack
    train_file, val_file = project.corpus_files()
    corpus = pack.corpus_kind.read_samples(project, val_file if split == "val" else train_file)
    total = expected_shards(project, split, len(corpus))
    rank = current_rank()
    if not _split_ready(project, split, rank, report, should_stop):
        return "stopped"
    own = [i for i in range(total) if i % rank.world == rank.rank]
    missing = [i for i in own if not shard_path(project, split, i).exists()]
    if rank.distributed:
        remove_temps(project, split, set(own))
        report("log", level="info", message=f"{rank}: {split} shards {', '.join(map(str, own)) or 'none'} "
                                            f"({len(missing)} of them to compute)")
    report("progress", count=len(own) - len(missing), total=len(own), unit="shards", **_rank_fields(rank),
           detail=f"{split}: {len(corpus)} prompts in {total} shards, {len(missing)} to compute")
    if missing and not should_stop():
        outcome = _compute(project, report, should_stop, split, corpus, missing, len(own), rank, loaded)
        if outcome != "done":
            return outcome
    elif missing:
        return "stopped"
    if rank.main and rank.distributed:     # the split is done when every rank's shards are on disk
        def done() -> bool:
            return all(shard_path(project, split, i).exists() for i in range(total))

        def waiting() -> None:
            have = sum(shard_path(project, split, i).exists() for i in range(total))
            report("progress", count=have, total=total, unit="shards", detail=f"{split}: waiting for the other "
                                                                                f"ranks ({have} of {total} shards)")
        if not wait_for(done, should_stop, on_wait=waiting):
            return "stopped"
    return "done"


def _rank_fields(rank: Rank) -> dict[str, int]:
    return {"rank": rank.rank, "world": rank.world} if rank.distributed else {}


def _split_ready(project: Project, split: str, rank: Rank, report: Report, should_stop: Callable[[], bool]) -> bool:
    """Rank 0 discards stale shards and marks the split; another rank starts once the split is
    marked for this run, or marks a split that holds no shard yet itself (so a rank started
    alone, or before rank 0, never waits for it)."""
    warn = lambda m: report("log", level="warning", message=m)   # noqa: E731
    if rank.main:
        prepare_split(project, split, warn, clean_temps=not rank.distributed)
        return True
    want = contract_for(project)

    def ready() -> bool:
        if read_contract(project, split) == want:
            return True
        if not shard_files(project, split):
            atomic_write_text(project.shards_dir(split) / "CONTRACT", want + "\n")
            return True
        return False
    return wait_for(ready, should_stop)


def _compute(project: Project, report: Report, should_stop: Callable[[], bool], split: str, corpus: list[Any],
             missing: list[int], owned: int, rank: Rank, loaded: list[tuple[Any, ...]]) -> str:
    pack, p = project.pack, project.settings.precompute
    size = p.val_shard_size if split == "val" else p.shard_size
    total = expected_shards(project, split, len(corpus))
    student, teacher, device, session, budgets = _models(project, report, loaded)
    rates: collections.deque[float] = collections.deque(maxlen=5)   # samples/s of the last shards
    done = owned - len(missing)
    for n, index in enumerate(missing):
        if should_stop():
            report("log", level="info", message=f"stop requested: {done} of {owned} {split} shards are on disk")
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
                "student": resolve_material(project, "student").name, "split": split, "shard": index,
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
        report("progress", count=done, total=owned, unit="shards", rate=round(rate, 2), **_rank_fields(rank),
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
    exit_process(stage_main("precompute", run))
