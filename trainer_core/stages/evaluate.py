"""Evaluate stage: the exported GGUF, read back as the engine would, scored on the val shards.

    python -m trainer_core.stages.evaluate --project DIR

It never scores the checkpoint alone: the adapter is rebuilt from the GGUF's tensors, and the
checkpoint it came from only serves for `roundtrip_cos` (≥ 0.999 when the export is right).
eval.json lives in the project, so projects sharing one output folder keep their own.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from trainer_core.base.allocator import keep_large_blocks, needs_large_blocks
from trainer_core.base.atomic import atomic_write_json
from trainer_core.base.errors import TrainerError
from trainer_core.base.events import Report
from trainer_core.contract import checkpoints
from trainer_core.contract.adapter_export import checkpoint_model
from trainer_core.contract.gguf_io import KV_CHECKPOINT, KV_PLANNED_STEPS, KV_TRAINED_STEPS, read_adapter_gguf
from trainer_core.contract.objective import model_outputs
from trainer_core.project import Project
from trainer_core.contract.shards import complete_shards, mock_enabled
from trainer_core.packs.eval_guide import MOCK_NOTE
from trainer_core.contract.stream import val_batches
from trainer_core.stages.base import exit_process, never, stage_main
from trainer_core.stages.model_card import write_card

__all__ = ["run", "evaluate_gguf"]


def _tensors(outputs: Any) -> list[torch.Tensor]:
    """The tensors of a model's outputs (one tensor or a tuple with Nones)."""
    items = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return [t for t in items if isinstance(t, torch.Tensor)] or [torch.zeros(0)]


@torch.no_grad()
def evaluate_gguf(project: Project, gguf: Path, ck: dict[str, Any], device: torch.device,
                  log: Callable[[str], None] = lambda message: None,
                  should_stop: Callable[[], bool] = never) -> dict[str, Any] | None:
    """The pack's metrics of the GGUF on every val shard, plus its round trip against `ck`; None when
    `should_stop` turns true before the last batch (a partial score is no score). On the CPU,
    the first batch decides the heap mode: metrics whose float64 rows exceed glibc's mmap ceiling
    (Ming's 355 × 3840 direct rows at batch 8: 87 MB) take every block from the heap (base/allocator.py:
    7.8 s instead of 15.3 s for Ming's 64 val samples in-process)."""
    adapter = read_adapter_gguf(gguf, device)
    config, ck_model = checkpoint_model(ck)
    ck_model.to(device)
    mu, sigma = ck["mu"].float().to(device), ck["sigma"].float().to(device)
    files = complete_shards(project, "val")
    kind = config.spec
    bank = ((ck["mu_bank"].float().to(device), ck["sigma_bank"].float().to(device))
            if kind.bank_head(config) is not None else None)
    metrics = kind.eval_metrics(config, mu, sigma, bank)
    samples, large = 0, device.type != "cpu"
    for batch in val_batches(files, project.settings.train.batch_size):
        if should_stop():
            return None
        batch = batch.to(device)
        pred = model_outputs(config, adapter.model, batch)                # teacher scale (folded)
        if not large:     # the metrics' float64 copies of the rows; in a stage's own process only
            large = True
            if needs_large_blocks(8 * max(t.numel() for t in _tensors(pred))) and keep_large_blocks():
                log("CPU metrics above 32 MiB a tensor: freed memory stays in the heap (up to 1 GiB) instead of "
                    "being unmapped at every batch")
        pred_ck = kind.teacher_scale(config, model_outputs(config, ck_model, batch), mu, sigma, bank)
        kind.eval_batch(metrics, batch, pred, pred_ck)
        samples += batch.size
    result = metrics.result()
    result["val_samples"] = samples
    return {"metrics": result, "config": config.to_dict(), "kvs": adapter.kvs}


def run(project: Project, report: Report, should_stop: Callable[[], bool] = never) -> str:
    from trainer_core.contract.devices import pick_device
    gguf = project.gguf_path()
    if not gguf.is_file():
        raise TrainerError(f"There is nothing to evaluate: {gguf} does not exist (run the export stage).")
    ck = checkpoints.load(project, checkpoints.BEST, mmap=True)
    device = pick_device(project.settings.train.device)
    started = time.monotonic()
    found = evaluate_gguf(project, gguf, ck, device,
                          lambda message: report("log", level="info", message=message), should_stop)
    if found is None:
        report("log", level="info", message="evaluation stopped before its last batch: eval.json is unchanged")
        return "stopped"
    kvs, m = found["kvs"], found["metrics"]
    record = {**m, "gguf": str(gguf), "kind": found["config"]["kind"], "config": found["config"],
              "trained_steps": kvs.get(KV_TRAINED_STEPS), "planned_steps": kvs.get(KV_PLANNED_STEPS),
              "checkpoint": kvs.get(KV_CHECKPOINT), "provenance": kvs, "time": time.time(),
              "seconds": round(time.monotonic() - started, 2), "pack": project.pack.id}
    atomic_write_json(project.eval_json, record)
    write_card(project)                                # the card's figures are this export's now
    shown = ", ".join(f"{k} {m[k]:.5f}" for k in project.pack.metric_names if isinstance(m.get(k), float))
    report("metric", **{k: v for k, v in m.items() if isinstance(v, (int, float))})
    report("artifact", path=str(project.eval_json), kind="eval")
    guide, mock = project.pack.judge, mock_enabled(project)        # the judged metric and its figure lead
    judged = guide.summary(m, mock) if guide else MOCK_NOTE if mock else ""
    report("log", level="info", message=f"evaluation of {gguf.name}: {judged + '; all: ' if judged else ''}{shown}")
    if m.get("roundtrip_cos", 1.0) < 0.999:
        report("log", level="warning", message=f"roundtrip_cos {m['roundtrip_cos']:.5f} < 0.999: the GGUF does not "
                                               f"reproduce its checkpoint")
    return "done"


if __name__ == "__main__":
    exit_process(stage_main("eval", run))
