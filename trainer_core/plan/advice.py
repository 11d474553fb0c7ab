"""The plan's advice: each warning names what does not fit this machine (disk, the card, RAM, a day) and the
setting value that would (`_corpus_that_fits`: the largest corpus within a room of seconds or bytes; the
deepest adapter whose training fits the RAM; how this pack's teacher leaves RAM for the card)."""
from __future__ import annotations

import dataclasses
from typing import Any

from trainer_core.base.diskspace import free_bytes, human
from trainer_core.contract.placement import card_budget_gib
from trainer_core.plan.estimate import adapter_config, sample_counts, shard_disk_estimate, teacher_bytes, train_ram
from trainer_core.project import Project
from trainer_core.packs.estimates import teacher_need_gib

__all__ = ["plan_warnings", "memory_warnings", "stream_hint", "LONG_TRAIN_S"]

LONG_TRAIN_S = 24 * 3600


def plan_warnings(project: Project, plan: dict[str, Any], hw: dict[str, Any]) -> list[str]:
    """Every warning the plan gives on this machine, each with the fix it names."""
    out = []
    free = free_bytes(project.root)
    shards = plan["stages"]["precompute_train"]["disk_bytes"] + plan["stages"]["precompute_val"]["disk_bytes"]
    other = plan["total_disk_bytes"] - shards
    n_train, n_val = sample_counts(project)
    if free is not None and other > free:
        out.append(f"Not enough disk: the checkpoints and the export alone take ~{human(other)} but {human(free)} is "
                   f"free at {project.root}; train a smaller adapter (train.depth={project.settings.train.depth} and "
                   f"train.width={project.settings.train.width} set its size) or free space first.")
    elif free is not None and plan["total_disk_bytes"] > free:
        per = shards / max(n_train + n_val, 1)
        out.append(f"Not enough disk: the run writes ~{human(plan['total_disk_bytes'])} but {human(free)} is free "
                   f"at {project.root}; " + _corpus_that_fits(project, free - other, 0.0, per,
                                                             "fits, or free space first", "free space first") + ".")
    weights = teacher_bytes(project)
    if weights and not project.settings.precompute.mock_teacher:
        mode = getattr(project.settings.precompute, project.pack.teacher_control, "auto")
        need_gib = teacher_need_gib(project)        # the teacher's own figure (contract/placement.py)
        need = int(need_gib * 2**30) if need_gib is not None else weights + 3 * 2**30
        budget = int(card_budget_gib(hw["gpus"][0]["memory_bytes"] / 2**30,
                                     project.settings.precompute.gpu_mem_gib) * 2**30) if hw["gpus"] else 0
        if hw["gpus"] and mode == "gpu" and need > budget:
            out.append(f"The teacher does not fit the card: teacher_mode=gpu needs ~{human(need)} on the GPU but the "
                       f"budget is {human(budget)}; set precompute.teacher_mode=offload (the weights stay in RAM "
                       f"and stream through the card) or auto.")
        ram = hw["ram_available_bytes"]
        if (not hw["gpus"] or mode == "offload") and weights > ram:
            out.append(f"The teacher does not fit in memory: its weights take ~{human(weights)} and {human(ram)} of "
                       f"RAM is available; {stream_hint(project)}, or free memory.")
    out += memory_warnings(project, plan, hw)
    seconds = plan["stages"]["train"]["seconds"]
    if seconds and seconds > LONG_TRAIN_S:
        per = seconds / max(project.settings.train.steps, 1)
        steps = int(LONG_TRAIN_S / per)
        out.append(f"Training takes ~{seconds / 3600:.0f} h; train.steps={steps} would take about a day "
                   f"(the schedule follows a changed count at any time).")
    pre = [plan["stages"][f"precompute_{s}"]["seconds"] for s in ("train", "val")]
    if pre[0] and sum(pre) > LONG_TRAIN_S:
        out.append(_precompute_hint(project, pre[0], pre[1] or 0.0, n_train, n_val))
    return out


def _precompute_hint(project: Project, train_s: float, val_s: float, n_train: int, n_val: int) -> str:
    """A precompute longer than a day, and the corpus that takes a day (_corpus_that_fits: the val stage's fixed
    cost, loading the models, kept)."""
    per = train_s / max(n_train, 1)
    head = f"Precompute takes ~{(train_s + val_s) / 3600:.0f} h for {n_train} train samples"
    gpu = f"at {per:.0f} s a sample on this machine, precompute on a GPU (precompute.device=cuda) or free the machine"
    return f"{head}; " + _corpus_that_fits(project, LONG_TRAIN_S, max(0.0, val_s - n_val * per), per,
                                           "would take a day", gpu) + "."


def _corpus_that_fits(project: Project, room: float, fixed: float, per: float, fits: str, otherwise: str) -> str:
    """The corpus whose samples, at `per` each (seconds or bytes) over a `fixed` cost, fit `room`: the train split
    cut, each count of its mix alike, beside the val split as set; when the val split alone fills the room, both
    cut alike; `otherwise` when not one sample of a split fits. Every count it names is at least 1 and, set, fits."""
    c = project.settings.corpus
    n_train, n_val = sample_counts(project)
    train_keys, val_keys = project.pack.corpus_kind.train_counts, project.pack.corpus_kind.val_counts

    def cut(keys: tuple[str, ...], scale: float) -> dict[str, int]:
        return {k: max(1, int(getattr(c, k) * scale)) for k in keys if getattr(c, k)}

    def named(counts: dict[str, int]) -> str:
        return ", ".join(f"corpus.{k}={n}" for k, n in counts.items())

    if per <= 0:
        return otherwise
    left = room - fixed - n_val * per
    if left >= per:
        train = cut(train_keys, int(left / per) / max(n_train, 1))
        if fixed + (sum(train.values()) + n_val) * per <= room:
            return f"a corpus of about {sum(train.values())} train samples ({named(train)}) {fits}"
    scale = max(0.0, room - fixed) / (per * max(n_train + n_val, 1))
    train, val = cut(train_keys, scale), cut(val_keys, scale)
    if train and val and fixed + per * (sum(train.values()) + sum(val.values())) <= room:
        return (f"the {n_val} val samples alone leave no room; about {sum(train.values())} train and "
                f"{sum(val.values())} val samples ({named(train)}, {named(val)}) {fits}")
    return otherwise


def stream_hint(project: Project) -> str:
    """How this pack's teacher leaves RAM for the card: the setting the pack places it with."""
    if project.pack.teacher_control == "teacher_mode":
        return "use a GPU with precompute.teacher_mode=offload (the weights stream through the card) or auto"
    return (f"use a GPU: precompute.{project.pack.teacher_control} spreads the teacher over the cards "
            f"(precompute.gpu_mem_gib, precompute.cpu_mem_gib bound each)")


def memory_warnings(project: Project, plan: dict[str, Any], hw: dict[str, Any]) -> list[str]:
    """The plan's own peak RAM against this machine's: when a stage would need more than the machine has, say
    which and the setting value that fits (for the adapter's stages, the deepest train.depth whose train stage
    the estimate's rule, estimate.train_ram, keeps within 90 % of the RAM)."""
    total = hw.get("ram_total_bytes")
    peak = plan.get("peak_ram_bytes")
    if not total or not peak or peak <= total:
        return []
    stage = max(plan["stages"], key=lambda name: plan["stages"][name]["peak_ram_bytes"] or 0)
    head = (f"The {stage} stage would need ~{human(peak)} of RAM (the plan's peak) but this machine has "
            f"{human(total)}")
    if stage.startswith("precompute"):
        return [head + f"; {stream_hint(project)}, or lower precompute.teacher_batch."]
    t, config = project.settings.train, adapter_config(project)
    if config is None:
        return [head + "; lower train.depth or train.width."]
    per, samples = shard_disk_estimate(project)["per_sample"] or 0, sample_counts(project)
    on_cuda = bool(hw["gpus"]) and t.device != "cpu"

    def fits(depth: int) -> bool:
        return train_ram(project, dataclasses.replace(config, depth=depth), per, samples, on_cuda) <= 0.9 * total
    low, high = 0, t.depth              # the parameters grow with the depth: the deepest that fits, by bisection
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    if low:
        return [head + f"; train.depth={low} fits (train.width={t.width}), or lower train.width."]
    return [head + "; even train.depth=1 does not fit at this width: lower train.width."]

