"""Train stage: the adapter on the precomputed shards, resumable to the bit.

    python -m trainer_core.stages.train --project DIR

`checkpoints/last.pt` (+ last.json) is saved every `save_every` steps, when a stop arrives
(after the current optimizer step), on a SNAPSHOT request and at the final step; `best.pt`
whenever validation improves. A checkpoint holds the model, the optimizer, the step, the
planned steps in force, the stream position, every RNG state, the target statistics, the
pack and the adapter config, so a resumed run takes exactly the steps an uninterrupted run
would have taken. The planned step count is re-read from project.json at every log interval.

Under a launcher (`gguf-trainer start` with train.gpus > 1 runs torchrun) the stage trains with
DDP: every rank reads the same global batch, takes its contiguous share of the samples and
weights its loss by its share of the batch's supervised rows, so the averaged gradient is the
one-process gradient of the whole batch; rank 0 alone validates, saves and reports, and a stop is
agreed by all ranks at the same step, so checkpoints and resumes are those of one process.
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Callable

import torch

from trainer_core.contract import checkpoints
from trainer_core.contract.adapter import count_parameters
from trainer_core.contract.adapter_import import load_start
from trainer_core.contract.kinds import AdapterConfig, build_adapter
from trainer_core.base import collector
from trainer_core.base.allocator import keep_large_blocks, needs_large_blocks
from trainer_core.base.atomic import atomic_write_text
from trainer_core.contract.dist import close_group, init_group, rank_device
from trainer_core.contract.dist import current as current_rank
from trainer_core.base.errors import first_line, TrainerError
from trainer_core.base.events import Report
from trainer_core.contract.objective import ValScore, as_float, batch_loss, model_outputs
from trainer_core.project import Project, settings_from_dict
from trainer_core.contract.schedule import load_optimizer, lr_at, make_optimizer
from trainer_core.contract.shards import Shard, complete_shards, load_stats
from trainer_core.contract.stream import Batch, ShardStream, StreamPosition, val_batches
from trainer_core.stages.base import exit_process, never, stage_main

__all__ = ["run", "Trainer", "metric_series", "grad_checkpointing"]

# what a checkpoint needs to resume from; one without them is skipped like a damaged file
RESUME_KEYS = ("config", "model", "optimizer", "step", "best_val_cos", "stream", "rng", "train_config")


class Trainer:
    def __init__(self, project: Project, report: Report):
        self.rank = current_rank()
        self.project = project
        self.report = report if self.rank.main else _errors_only(report)   # rank 0 speaks for the stage
        self.pack = project.pack
        t = self.t = project.settings.train
        self.device = rank_device(t.device, self.rank)
        if self.rank.distributed:
            init_group(self.device)
        self.ckpt = project.checkpoints_dir
        train_files, self.val_files = complete_shards(project, "train"), complete_shards(project, "val")
        in_dim = int(Shard(train_files[0]).meta["in_dim"])
        self.config: AdapterConfig = self.pack.adapter_config(project, in_dim)
        taps = self.config.spec.tap_count(self.config)          # a stack of teacher layers per row: σ per tap
        mu, sigma, floored = load_stats(project, t.sigma_floor, taps)
        self.mu, self.sigma = mu.to(self.device), sigma.to(self.device)
        self.bank_stats: tuple[torch.Tensor, torch.Tensor] | None = None      # a second head's (a bank's)
        if self.config.spec.bank_head(self.config) is not None:
            bmu, bsigma, _ = load_stats(project, t.sigma_floor, prefix="bstat")
            self.bank_stats = (bmu.to(self.device), bsigma.to(self.device))
        torch.manual_seed(t.seed)
        model = build_adapter(self.config)
        self.pack.load_frozen(project, model)      # parts the engine applies as they are (MageFlow's vision_proj)
        model.checkpointing = grad_checkpointing(t.grad_checkpoint, self.config, self.device)
        self.model = model.to(self.device)
        self.net: torch.nn.Module = self.model          # what the training step runs: DDP under a launcher
        if self.rank.distributed:
            from torch.nn.parallel import DistributedDataParallel
            self.net = DistributedDataParallel(self.model, device_ids=[self.device.index]
                                               if self.device.type == "cuda" else None)
        self._eager_net = self.net
        self.compiled = t.compile == "on" or (t.compile == "auto" and self.device.type == "cuda")
        if self.compiled:      # dynamic: the student length varies from batch to batch
            self.net = torch.compile(self.net, dynamic=True)
        self._first_step = True
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, t.lr, t.weight_decay)
        self.step, self.planned = 0, t.steps
        self.best_val_cos, self.val, self.val_step = -1.0, None, None
        self.amp = self.device.type == "cuda"
        # on a GPU the batches stay bf16 (half the bytes to copy), are collated into page-locked
        # memory and read two ahead by a thread, so the GPU never waits for the disk or the CPU
        self.loading = {"keep_dtype": True, "pin": True, "prefetch": 2} if self.amp else {}
        self.stream = ShardStream(train_files, t.batch_size, t.seed, **self.loading)
        self._settings_mtime = project.project_json.stat().st_mtime_ns
        how = ", ".join(x for x in ("torch.compile" if self.compiled else "",
                                    "activation checkpointing" if model.checkpointing else "",
                                    f"DDP over {self.rank.world} processes" if self.rank.distributed else "") if x)
        self.report("log", level="info", message=(
            f"adapter {self.config.kind}: width {self.config.width}, depth {self.config.depth}, "
            f"{count_parameters(self.model) / 1e6:.1f}M parameters, in {in_dim} → out {self.config.out_dim}; "
            f"{len(train_files)} train / {len(self.val_files)} val shards; device {self.device}"
            f"{' (' + how + ')' if how else ''}; σ floored at {t.sigma_floor}"
            f"{' × the median σ of each tap' if taps else ''} on {floored} of {sigma.numel()} dims"))

    # ------------------------------------------------------------ checkpoints
    def resume(self) -> bool:
        """Continue from last.pt, else from best.pt when last.pt is damaged, else from step 0 (from the start
        adapter when the project has one); every file skipped is named in a warning."""
        which, ck, skipped = checkpoints.load_resumable(self.project, RESUME_KEYS, map_location=self.device)
        for why in skipped:
            self.report("log", level="warning", message=f"skipped a damaged checkpoint: {why}")
        if ck is None:
            if skipped:
                self.report("log", level="warning", message="no readable checkpoint is left; training starts "
                                                            "over from step 0")
                if self.rank.main:
                    self._truncate_metrics(0)
            started = load_start(self.project, self.model, self.config, self.mu, self.sigma, self.bank_stats)
            if started:          # `new --from-adapter`: the file's weights, step 0, a fresh optimizer
                self._log(started)
            return False
        saved = AdapterConfig.from_dict(ck["config"])
        if saved != self.config:
            old, new = saved.to_dict(), self.config.to_dict()
            diff = ", ".join(f"{k} {old[k]} → {new.get(k)}" for k in old if old[k] != new.get(k))
            raise TrainerError(f"checkpoints/{which}.pt was trained with another adapter ({diff}); reset training "
                               f"(delete checkpoints/) or restore the settings it was trained with.")
        self.model.load_state_dict(ck["model"])
        load_optimizer(self.optimizer, ck["optimizer"])
        self.step, self.best_val_cos = ck["step"], ck["best_val_cos"]
        self.val, self.val_step = ck.get("val"), ck.get("val_step")
        self.stream.position = StreamPosition(**ck["stream"])
        torch.set_rng_state(ck["rng"]["cpu"])
        if torch.cuda.is_available() and ck["rng"].get("cuda"):
            torch.cuda.set_rng_state_all(ck["rng"]["cuda"])
        if ck["train_config"]["steps"] != self.planned:
            self._log(f"planned steps changed since the checkpoint: {ck['train_config']['steps']} -> {self.planned}")
        if self.rank.main:
            self._truncate_metrics(self.step)
        self._log(f"resumed from {which}.pt at step {self.step} (best val cos {self.best_val_cos:.4f})")
        return True

    def save(self, name: str) -> None:
        ck = {"config": self.config.to_dict(), "model": self.model.state_dict(),
              "optimizer": self.optimizer.state_dict(), "step": self.step,
              "train_config": {**self.t.flat(), "steps": self.planned}, "best_val_cos": self.best_val_cos,
              "val": self.val if self.val_step == self.step else None, "val_step": self.val_step,
              "stream": self.stream.position.to_dict(),
              "rng": {"cpu": torch.get_rng_state(),
                      "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
              "mu": self.mu.cpu(), "sigma": self.sigma.cpu(), "standardized": self.config.spec.standardized,
              "pack": self.pack.id, "time": time.time(), **self._bank_stats_record()}
        current = self.val if self.val_step == self.step else None
        path = checkpoints.save(self.project, name, ck, checkpoints.Sidecar(
            trained_steps=self.step, planned_steps=self.planned, best_val_cos=self.best_val_cos,
            val_cos=current["val_cos"] if current else None, val=current, val_step=self.val_step, time=ck["time"]))
        self.report("artifact", path=str(path), kind=f"checkpoint_{name}", step=self.step)

    def _bank_stats_record(self) -> dict[str, torch.Tensor]:
        """The bank head's statistics (the export folds them into out_bank)."""
        if self.bank_stats is None:
            return {}
        return {"mu_bank": self.bank_stats[0].cpu(), "sigma_bank": self.bank_stats[1].cpu()}

    def keep_step(self, forced: bool) -> None:
        """Kept steps (train.history): weights-only copies inside [history_from, history_to]."""
        t, n = self.t, self.step
        if not t.history or n < t.history_from or (t.history_to and n > t.history_to):
            return
        every = t.history_every or t.val_every
        if not forced and n % every:
            return
        from trainer_core.contract.gguf_io import gguf_dtype
        heads = self.config.spec.folded_heads(self.config)                         # folded at export: f32
        state = {k: (v.half() if gguf_dtype(k, v.ndim) == "f16" and not k.startswith(heads) else v.float())
                 for k, v in self.model.state_dict().items()}
        path = checkpoints.save_kept_step(self.project, {
            "config": self.config.to_dict(), "model": state, "step": n, "planned_steps": self.planned,
            "best_val_cos": self.best_val_cos, "mu": self.mu.cpu(), "sigma": self.sigma.cpu(),
            "standardized": self.config.spec.standardized, "pack": self.pack.id, **self._bank_stats_record()},
            checkpoints.Sidecar(
            trained_steps=n, planned_steps=self.planned, best_val_cos=self.best_val_cos,
            val_cos=self.val["val_cos"] if self.val_step == n and self.val else None, time=time.time()))
        checkpoints.prune_kept_steps(self.project, t.history_keep)
        self._log(f"kept step {n} -> {path.relative_to(self.project.root)}")

    # ------------------------------------------------------------ math
    def forward(self, batch: Batch, net: torch.nn.Module | None = None) -> Any:
        """The model's output in float32 (a tuple for the bridge: objective.model_outputs)."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            return as_float(model_outputs(self.config, self.model if net is None else net, batch))

    def losses(self, batch: Batch, net: torch.nn.Module | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return batch_loss(self.config, batch, self.forward(batch, net), self.mu, self.sigma, self.t.cos_weight,
                          self.bank_stats)

    def train_step(self, batch: Batch) -> dict[str, Any]:
        """One optimizer step on a (global) batch; the statistics stay device tensors. A compiled step
        that fails the first time (no compiler, an unsupported op) falls back to eager, with a warning."""
        if not (self.compiled and self._first_step):
            return self._train_step(batch)
        self._first_step = False
        try:
            return self._train_step(batch)
        except Exception as e:  # noqa: BLE001 — torch.compile raises many kinds; eager is always available
            first = first_line(e)[:200]
            self.report("log", level="warning", message=f"torch.compile failed ({type(e).__name__}: {first}); "
                                                        "training continues without it (train.compile off)")
            self.net, self.compiled = self._eager_net, False
            return self._train_step(batch)

    def _train_step(self, batch: Batch) -> dict[str, Any]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step, self.t.lr, self.t.warmup, self.planned)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        world = self.rank.world
        mine = self._share(batch) if self.rank.distributed else batch
        chunks = self._chunks(mine) if mine.size else []
        weighted = len(chunks) > 1 or self.rank.distributed
        total_rows = float(batch.rows_weight) if weighted else 1
        # the step's statistics stay on the device: reading them (float()) would wait for the
        # GPU every step; train() reads them once per log interval
        stats: dict[str, Any] = {}
        for j, chunk in enumerate(chunks):
            share = float(chunk.rows_weight) / max(total_rows, 1e-12) if weighted else 1.0
            # DDP averages the ranks' gradients (÷ world) once per step, at the last micro-batch
            sync = contextlib.nullcontext() if j == len(chunks) - 1 or self.net is self.model else self.net.no_sync()
            with sync:
                loss, parts = self.losses(chunk, self.net)
                (loss * share * world).backward()
            for k, v in (("loss", loss), ("cos", parts["cos"]), ("rel_mse", parts["rel_mse"])):
                v = v.detach().float() * share
                stats[k] = v if k not in stats else stats[k] + v
        if self.rank.distributed:
            if not chunks:        # no sample for this rank in a short batch: still take part in the all-reduce
                sum(p.sum() * 0.0 for p in self.net.parameters() if p.requires_grad).backward()
            import torch.distributed as td
            names = ("loss", "cos", "rel_mse")
            together = torch.stack([stats[k] if k in stats else torch.zeros((), device=self.device)
                                    for k in names])
            td.all_reduce(together)
            stats = dict(zip(names, together))
        if self.t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.grad_clip)
        self.optimizer.step()
        self.step += 1
        stats["lr"] = self.optimizer.param_groups[0]["lr"]
        return stats

    def _share(self, batch: Batch) -> Batch:
        """This rank's contiguous share of the samples of a global batch."""
        rows = torch.tensor_split(torch.arange(batch.size), self.rank.world)[self.rank.rank]
        a, b = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)
        return Batch(*(None if x is None else x[a:b] for x in batch.parts()))

    def _chunks(self, batch: Batch) -> list[Batch]:
        """Micro-batches of rows × tokens ≤ train.batch_tokens (0 = the whole batch)."""
        budget = self.t.batch_tokens
        per_row = batch.h.shape[1] + batch.target.shape[1]
        per_row += self.config.spec.extra_rows(self.config, batch)       # a kind's extra keys (vision, a bank)
        if budget <= 0 or batch.size * per_row <= budget:
            return [batch]
        n = max(1, budget // per_row)
        cut = lambda t, a: None if t is None else t[a:a + n]  # noqa: E731
        return [Batch(*(cut(x, a) for x in batch.parts())) for a in range(0, batch.size, n)]

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Means of per-batch val_cos and val_rel_mse over every val shard (one batch in memory)."""
        self.model.eval()
        by_sample = getattr(self.pack, "supervise", "all") == "consumed_text"   # no supervised vision rows
        score = ValScore(self.config, self.mu, self.sigma, by_sample, self.bank_stats)
        for batch in val_batches(self.val_files, self.t.batch_size, **self.loading):
            batch = batch.to(self.device)
            score.add(batch, self.forward(batch))
        self.val = score.result()
        self.val_step = self.step
        improved = self.val["val_cos"] > self.best_val_cos
        if improved:
            self.best_val_cos = self.val["val_cos"]
        self.report("metric", step=self.step, planned_steps=self.planned, best_val_cos=self.best_val_cos, **self.val)
        self.ckpt.mkdir(parents=True, exist_ok=True)          # validate() may run before train() (bench, tools)
        with open(checkpoints.series_path(self.project, "val"), "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": self.step, "planned_steps": self.planned, **self.val,
                                "best_val_cos": self.best_val_cos, "time": time.time()}) + "\n")
        self._log(f"val @ {self.step}: rel_mse {self.val['val_rel_mse']:.5f} cos {self.val['val_cos']:.5f} "
                  f"(best {self.best_val_cos:.5f})")
        if improved:
            self.save("best")
        return self.val

    # ------------------------------------------------------------ the loop
    def train(self, should_stop: Callable[[], bool]) -> str:
        try:
            return self._train(self._agreed(should_stop) if self.rank.distributed else should_stop)
        finally:
            self.stream.close()          # the read-ahead thread, if any
            if self.rank.distributed:
                close_group()

    def _agreed(self, should_stop: Callable[[], bool]) -> Callable[[], bool]:
        """A stop every rank sees at the same step (any rank's request stops them all)."""
        import torch.distributed as td

        def agreed() -> bool:
            flag = torch.tensor([1.0 if should_stop() else 0.0], device=self.device)
            td.all_reduce(flag, op=td.ReduceOp.MAX)
            return bool(flag.item())
        return agreed

    def _train(self, should_stop: Callable[[], bool]) -> str:
        main = self.rank.main
        self.ckpt.mkdir(parents=True, exist_ok=True)
        if main:
            self.project.snapshot_file.unlink(missing_ok=True)
            stale = checkpoints.remove_temps(self.project)
            if stale:
                self._log(f"removed {len(stale)} temp file(s) of a save a kill interrupted: "
                          f"{', '.join(p.name for p in stale[:5])}{' …' if len(stale) > 5 else ''}")
        resumed = self.resume()
        if self.step >= self.planned:
            self._log(f"training already complete at step {self.step} (train.steps = {self.planned}); "
                      f"raise train.steps to continue")
            return "done"
        self.report("status", status="running", resumed_at=self.step if resumed else 0, planned_steps=self.planned)
        t, window_start, window_samples, session = self.t, time.monotonic(), 0, (time.monotonic(), self.step)
        window_steps = 0          # steps in this log window: fewer than log_every right after a resume
        acc = {"loss": 0.0, "cos": 0.0, "rel_mse": 0.0}
        while self.step < self.planned:
            if should_stop():
                return self._stop()
            batch = self.stream.next().to(self.device)
            stats = self.train_step(batch)
            window_samples += batch.size
            window_steps += 1
            for k in acc:
                acc[k] += stats[k]
            if main and self.project.snapshot_file.exists():
                self._snapshot()
            if self.step % t.log_every == 0:
                now = time.monotonic()
                rate = window_samples / max(now - window_start, 1e-9)
                steps_per_s = (self.step - session[1]) / max(now - session[0], 1e-9)
                point = {"step": self.step, "planned_steps": self.planned,
                         **{k: float(v) / window_steps for k, v in acc.items()},
                         "lr": stats["lr"], "samples_per_s": round(rate, 2),
                         "eta_s": round((self.planned - self.step) / max(steps_per_s, 1e-9), 1)}
                if main:
                    self._record(point)
                    self._reread_steps()
                if self.rank.distributed:       # rank 0's count of planned steps is everyone's
                    import torch.distributed as td
                    planned = torch.tensor([self.planned], device=self.device)
                    td.broadcast(planned, 0)
                    self.planned = int(planned.item())
                acc = {k: 0.0 for k in acc}
                window_start, window_samples, window_steps = now, 0, 0
            final = self.step >= self.planned
            if main and (self.step % t.val_every == 0 or final):
                self.report("progress", count=self.step, total=self.planned, unit="steps",
                            detail=f"validating at step {self.step}")
                self.validate()
            if main and (self.step % t.save_every == 0 or final):
                self.save("last")
            if main:
                self.keep_step(forced=final)
            if should_stop():
                return self._stop()
        if main and not checkpoints.exists(self.project, checkpoints.BEST):
            self.save("best")
        if main:
            self.project.snapshot_file.unlink(missing_ok=True)
        self._log(f"done at step {self.step}, best val cos {self.best_val_cos:.5f}")
        return "done"

    def _stop(self) -> str:
        if not self.rank.main:
            return "stopped"
        if self.val_step != self.step:
            self.validate()
        self.save("last")
        self.keep_step(forced=True)
        if not checkpoints.exists(self.project, checkpoints.BEST):
            self.save("best")
        self._log(f"stop requested: saved last.pt at step {self.step}")
        return "stopped"

    def _snapshot(self) -> None:
        self.validate()
        self.save("last")
        self.keep_step(forced=True)
        self.project.snapshot_file.unlink(missing_ok=True)
        self._log(f"snapshot request: validated and saved last.pt at step {self.step} "
                  f"(val cos {self.val['val_cos']:.5f}); training continues")

    def _reread_steps(self) -> None:
        """Pick up a changed train.steps (only that) when project.json was saved since."""
        try:
            mtime = self.project.project_json.stat().st_mtime_ns
            if mtime == self._settings_mtime:
                return
            self._settings_mtime = mtime
            steps = settings_from_dict(json.loads(self.project.project_json.read_text("utf-8"))).train.steps
        except Exception as e:  # an edit in progress or an invalid value: keep the count in force
            self._log(f"project.json changed but could not be read ({type(e).__name__}); keeping "
                      f"train.steps = {self.planned}")
            return
        if steps == self.planned:
            return
        how = "finishing now" if steps <= self.step else "the lr schedule follows the new count"
        self._log(f"planned steps changed: {self.planned} -> {steps} (project settings edited at step "
                  f"{self.step}); {how}")
        self.planned = steps
        if steps <= self.step:
            self.planned = self.step
        self.report("status", status="running", planned_steps=self.planned)

    # ------------------------------------------------------------ records
    def _record(self, point: dict[str, Any]) -> None:
        point = {k: (round(v, 6) if isinstance(v, float) and k != "lr" else v) for k, v in point.items()}
        self.report("metric", **point)
        self.report("progress", count=self.step, total=self.planned, unit="steps", eta_s=point["eta_s"],
                    rate=point["samples_per_s"])
        self._log(f"step {self.step}/{self.planned} loss {point['loss']:.5f} rel_mse {point['rel_mse']:.5f} "
                  f"cos {point['cos']:.5f} lr {point['lr']:.3e} {point['samples_per_s']:.1f} p/s")
        with open(checkpoints.series_path(self.project), "a", encoding="utf-8") as f:
            f.write(json.dumps({**point, "time": time.time()}) + "\n")

    def _truncate_metrics(self, step: int) -> None:
        """After a resume the series continues from `step`: points logged past the checkpoint
        (before a hard kill) are dropped, so the series never repeats or skips a step."""
        for path in (checkpoints.series_path(self.project), checkpoints.series_path(self.project, "val")):
            if not path.is_file():
                continue
            kept = [line for line in path.read_text("utf-8").splitlines()
                    if line.strip() and _step_of(line) is not None and _step_of(line) <= step]
            atomic_write_text(path, "".join(line + "\n" for line in kept))

    def _log(self, message: str) -> None:
        self.report("log", level="info", message=message)


def grad_checkpointing(setting: str, config: AdapterConfig, device: torch.device) -> bool:
    """train.grad_checkpoint: "on" recomputes each block's activations in the backward pass (the same
    weights; bench/grad_checkpoint.py: 28 % less peak memory for the resampler, 36 % for the bridge, ~5 %
    for the layerwise kind, at up to 1.35× the step time); "auto" turns it on only where activations
    dominate a GPU's memory: the kinds that say so (`grad_checkpoint_auto`: the Qwen3.5 bridge, a bank and
    up to 2304 slots over 4096-d keys) on CUDA."""
    return setting == "on" or (setting == "auto" and config.spec.grad_checkpoint_auto and device.type == "cuda")


def _errors_only(report: Report) -> Report:
    """What a rank other than 0 reports: its errors (rank 0 reports progress, metrics and logs)."""
    def forward(type: str, **payload: Any) -> None:
        if type == "error":
            report(type, **payload)
    return forward


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def large_block_step(trainer: Trainer) -> bool:
    """Whether a CPU step's [B, R, D] float32 temporaries (a resampler's fixed R query rows) are above
    glibc's mmap ceiling, so that each would be mapped and faulted in again at every step."""
    c = trainer.config
    rows = c.spec.step_rows(c)
    if trainer.device.type != "cpu" or not rows:
        return False
    return needs_large_blocks(trainer.t.batch_size * rows * c.out_dim * 4)


def run(project: Project, report: Report, should_stop: Callable[[], bool] = never) -> str:
    with collector.loading():           # the adapter, its optimizer and the code they import (base/collector.py)
        trainer = Trainer(project, report)
    if large_block_step(trainer) and keep_large_blocks():     # the stage's own process (base/allocator.py)
        report("log", level="info", message="CPU steps above 32 MiB a tensor: freed memory stays in the heap "
                                            "(up to 1 GiB) instead of being unmapped at every step")
    return trainer.train(should_stop)


def metric_series(project: Project, name: str = "metrics") -> list[dict[str, Any]]:
    """The training metrics of the project, one point per log interval, no repeats
    (name "val": the validation points, one per validation)."""
    path = checkpoints.series_path(project, name)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


if __name__ == "__main__":
    exit_process(stage_main("train", run))
