"""Train-stage throughput and memory: the real stage (A) against a bare PyTorch loop (B).

    PYTHONPATH=. python bench/train.py [--pack ID] [--steps N] [--prompts N] [--device cpu|cuda]
        [--width W] [--depth D] [--batch B] [--rounds R] [--threads T] [--scale S]
        [--cadence default|demo] [--profile FILE] [--no-rss]

A demo project (trainer_core.demo) of the pack (`--pack`, any demo pack; the first demo, PixArt, by default) is
built in a temp folder with N synthetic train prompts (image packs: N samples, half with a reference
image); its corpus and precompute stages run for real. The defaults (width 128, depth 2, batch 32, 300
steps) keep a whole run near 3 minutes on 2 CPU cores. `--cadence default` (the default) keeps
the settings' own cadence (metrics every 25 steps, last.pt every 250, validation every 500, so a
300-step round saves twice and validates once, at its end); `--cadence demo` is the demo's (metrics
every 10, validation and last.pt every 50), ten times the validation work of a real run. After a short warm-up, rounds alternate A B A B:

  A  the train stage: `Trainer(project, report).train(never)` from a fresh checkpoints folder,
     with its real cadence (metrics every log_every, validation every val_every, last.pt every
     save_every, best.pt whenever validation improves) and its stream of memory-mapped shards;
  B  the minimum: the same adapter (same config, same seed and frozen parts, so the same init),
     AdamW 0.9/0.95, the same lr schedule and gradient clipping, the pack's own loss
     (`objective.batch_loss` of `objective.model_outputs`, float32, no host sync), on the same
     batches collated once into memory before the round: no stream, I/O, logging or validation.

Both runs do the same optimizer math on the same batches, so they end on the same weights
(`same_weights` checks it). The figures are medians; `ratio` is the median of the per-pair
A/B ratios, so slow drift of the machine cancels. Every A round also times, exclusively, the
parts of the stage (`stage_ms`: stream, train_step, validation, checkpoint saves, metrics),
which shows where the gap to B goes; `minor_faults_per_step` counts the page faults of each
round (heap memory glibc gave back to the kernel and the next step touched again).

Peak RSS: the stage is trained again in a fresh child process (this script with --rss-child)
on the project and on a second project whose corpus is `--scale` times larger, same steps and
settings; each child reports the peak RSS of its own address space (VmHWM; see rss_child for
why not ru_maxrss), over its whole life and inside train() alone, and the most file-backed RSS
(mapped shard pages and libraries) seen after any batch; `*_8x` names the --scale run. The
last line on stdout is one JSON object; the rest goes to stderr. `--profile FILE` also runs
one more A round under cProfile and writes its cumulative and own-time tables there.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from trainer_core.base.allocator import keep_heap_pad, keep_large_blocks
from trainer_core.contract.kinds import build_adapter
from trainer_core.demo import build_demo
from trainer_core.packs.common.tiny_models import demo_prompts
from trainer_core.base.errors import TrainerError
from trainer_core.base.events import ListReport
from trainer_core.contract.objective import batch_loss, model_outputs
from trainer_core.project import Project
from trainer_core.contract.schedule import lr_at, make_optimizer
from trainer_core.contract.shards import valid_shards
from trainer_core.stages import corpus as corpus_stage
from trainer_core.stages import precompute as precompute_stage
from trainer_core.stages.base import never
from trainer_core.contract.corpus_files import read_corpus
from trainer_core.stages.train import Trainer, large_block_step
from trainer_core.contract.stream import Batch, ShardStream

BENCH_SEED = 7    # the synthetic corpus; the demo's own prompts use trainer_core.demo.SEED
STAGE_PARTS = ("stream", "train_step", "validate", "save", "metrics", "keep_step")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.no_heap_pad:
        keep_heap_pad()         # as every stage process does (stage_main): A and B alike
    if args.rss_child:
        return rss_child(Path(args.rss_child), heap_settings=not args.no_heap_pad)
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        os.environ["GGUF_TRAINER_HOME"] = str(Path(tmp) / "home")   # keep the user's last project
        try:
            project = build_project(Path(tmp) / "1x", args, args.prompts)
            if not args.no_heap_pad and large_block_step(Trainer(project, ListReport())):
                keep_large_blocks()     # as the train stage's process does (stages/train.py run): A and B alike
            figures = measure(project, args)
        except TrainerError as e:   # e.g. --device cuda on a machine without one
            log(f"bench/train.py: {e}")
            return 2
        if args.profile:
            profile_a(project, args.profile)
        if not args.no_rss:
            big = build_project(Path(tmp) / f"{args.scale}x", args, args.prompts * args.scale)
            small_rss, big_rss = (peak_rss_child(p, args) for p in (project, big))
            figures.update(peak_rss_mib_1x=small_rss["peak_rss_mib"], peak_rss_mib_8x=big_rss["peak_rss_mib"],
                           rss_growth=round(big_rss["peak_rss_mib"] / small_rss["peak_rss_mib"], 3),
                           train_rss_growth=_ratio(big_rss["train_peak_rss_mib"], small_rss["train_peak_rss_mib"]),
                           rss_file_delta_mib=round(big_rss["max_rss_file_mib"] - small_rss["max_rss_file_mib"], 1),
                           rss_children=[small_rss, big_rss])
    print_table(figures)
    print(json.dumps(figures))
    return 0


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from trainer_core.packs import DEMO_PACKS
    parser.add_argument("--pack", default=DEMO_PACKS[0], help="the demo pack whose geometry is measured "
                        f"(default: the first demo, {DEMO_PACKS[0]})")
    parser.add_argument("--steps", type=int, default=300, help="train.steps of every run (default 300)")
    parser.add_argument("--prompts", type=int, default=480, help="train prompts of the 1x corpus (default 480)")
    parser.add_argument("--device", default="cpu", help="train.device (default cpu)")
    parser.add_argument("--width", type=int, default=128, help="train.width (default 128)")
    parser.add_argument("--depth", type=int, default=2, help="train.depth (default 2)")
    parser.add_argument("--batch", type=int, default=32, help="train.batch_size (default 32)")
    parser.add_argument("--rounds", type=int, default=2, help="timed A/B pairs (default 2)")
    parser.add_argument("--scale", type=int, default=8, help="corpus factor of the second RSS run (default 8)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--cadence", choices=("default", "demo"), default="default",
                        help="log/val/save cadence: the settings' defaults (25/500/250) or the demo's (10/50/50)")
    parser.add_argument("--no-heap-pad", action="store_true",
                        help="leave glibc's heap trimming as it is (the stage processes keep a top pad)")
    parser.add_argument("--profile", default="", help="write a cProfile table of one more A round here")
    parser.add_argument("--no-rss", action="store_true",
                        help="throughput only: skip the two peak-RSS child runs (their figures stay 0)")
    parser.add_argument("--rss-child", default="", help=argparse.SUPPRESS)   # internal: one RSS run
    args = parser.parse_args(argv)
    if args.prompts < 100 or args.steps < 1 or args.rounds < 1 or args.scale < 2:
        parser.error("--prompts must be at least 100, --steps and --rounds at least 1, --scale at least 2")
    return args


def bench_settings(args: argparse.Namespace) -> list[str]:
    """The train settings of every run; the cadence is the settings' defaults or the demo's."""
    from trainer_core.base.config import TrainSettings
    d = TrainSettings()
    log_every, val_every, save_every = ((10, 50, 50) if args.cadence == "demo"
                                        else (d.log_every, d.val_every, d.save_every))
    return [f"train.device={args.device}", f"train.width={args.width}", f"train.depth={args.depth}",
            f"train.batch_size={args.batch}", f"train.steps={args.steps}", "train.warmup=20", "train.batch_tokens=0",
            f"train.log_every={log_every}", f"train.val_every={val_every}", f"train.save_every={save_every}"]


def build_project(root: Path, args: argparse.Namespace, n_train: int) -> Project:
    """The pack's demo project with n_train synthetic train samples, its corpus and shards written."""
    started = time.perf_counter()
    project = build_demo(root, args.pack)
    prompt_file = project.materials_dir / "bench_prompts.txt"
    # the demo's word lists, on whose prompts the demo's T5 vocabulary was trained
    prompts = demo_prompts(n_train + project.settings.corpus.n_val + 200, seed=BENCH_SEED)
    prompt_file.write_text("".join(p + "\n" for p in prompts), encoding="utf-8")
    size = ([f"corpus.n_image={n_train // 2}", f"corpus.n_text={n_train - n_train // 2}", "corpus.n_two=0"]
            if project.pack.corpus_kind.reference_images else [f"corpus.n_train={n_train}"])
    project.update_settings([f"corpus.extra_files=materials/demo_prompts.txt,materials/{prompt_file.name}",
                             *size] + bench_settings(args))
    report = ListReport()
    corpus_stage.run(project, report)
    precompute_stage.run(project, report, split="val")
    precompute_stage.run(project, report, split="train")
    log(f"built {root.name}: {n_train} train prompts in {len(valid_shards(project, 'train'))} shards "
        f"({time.perf_counter() - started:.1f} s)")
    return project


# ------------------------------------------------------------ the two paths

def run_a(project: Project, timers: "Timers | None" = None) -> Trainer:
    """The train stage from a fresh checkpoints folder; timers see its parts."""
    shutil.rmtree(project.checkpoints_dir, ignore_errors=True)
    trainer = Trainer(project, ListReport())
    with contextlib.ExitStack() as stack:
        if timers is not None:
            for part, owner, attr in (("stream", trainer.stream, "next"), ("train_step", trainer, "train_step"),
                                      ("validate", trainer, "validate"), ("save", trainer, "save"),
                                      ("metrics", trainer, "_record"), ("keep_step", trainer, "keep_step")):
                stack.enter_context(timers.wrap(owner, attr, part))
        with timers.total() if timers is not None else contextlib.nullcontext():
            trainer.train(never)
    return trainer


class Bare:
    """B: the same adapter, optimizer, schedule and loss as the stage, and nothing else."""

    def __init__(self, project: Project, trainer: Trainer):
        self.t, self.config = trainer.t, trainer.config
        self.mu, self.sigma, self.bank_stats = trainer.mu, trainer.sigma, trainer.bank_stats
        torch.manual_seed(self.t.seed)                     # the stage's init
        model = build_adapter(self.config)
        project.pack.load_frozen(project, model)           # the frozen parts the stage loads
        self.model = model.to(trainer.device)
        self.optimizer = make_optimizer([p for p in self.model.parameters() if p.requires_grad], self.t.lr,
                                        self.t.weight_decay)            # the multi-tensor AdamW, as the stage

    def run(self, batches: list[Batch]) -> None:
        t, model, optimizer = self.t, self.model, self.optimizer
        model.train()
        for step, batch in enumerate(batches):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, t.lr, t.warmup, t.steps)
            optimizer.zero_grad(set_to_none=True)
            out = model_outputs(self.config, model, batch)
            out = tuple(None if o is None else o.float() for o in out) if isinstance(out, tuple) else out.float()
            loss, _ = batch_loss(self.config, batch, out, self.mu, self.sigma, t.cos_weight, self.bank_stats)
            loss.backward()
            if t.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            optimizer.step()


def stream_batches(project: Project, device: torch.device) -> list[Batch]:
    """The batches the stage's stream yields in a run of train.steps, collated up front."""
    t = project.settings.train
    stream = ShardStream(valid_shards(project, "train"), t.batch_size, t.seed)
    return [stream.next().to(device) for _ in range(t.steps)]


# ------------------------------------------------------------ measuring

def measure(project: Project, args: argparse.Namespace) -> dict[str, Any]:
    t = project.settings.train
    probe = Trainer(project, ListReport())                 # config, σ and device, as the stage sees them
    device = probe.device
    batches = stream_batches(project, device)
    warm_up(probe, batches[:10])
    rates_a, rates_b, parts, faults_a, faults_b = [], [], [], [], []
    for r in range(1, args.rounds + 1):
        timers, before = Timers(device), minor_faults()
        trainer = run_a(project, timers)
        faults_a.append((minor_faults() - before) / t.steps)
        rates_a.append(t.steps / timers.seconds["total"])
        parts.append(timers.seconds)
        bare, before = Bare(project, probe), minor_faults()
        rates_b.append(t.steps / timed(device, bare.run, batches))
        faults_b.append((minor_faults() - before) / t.steps)
        log(f"round {r}: A {rates_a[-1]:.2f} steps/s, B {rates_b[-1]:.2f} steps/s, "
            f"A/B {rates_a[-1] / rates_b[-1]:.3f}; page faults per step A {faults_a[-1]:.0f}, B {faults_b[-1]:.0f}")
    stage_ms = {k: round(statistics.median(p[k] for p in parts) * 1e3, 1) for k in (*STAGE_PARTS, "total")}
    stage_ms["loop_other"] = round(stage_ms["total"] - sum(stage_ms[k] for k in STAGE_PARTS), 1)
    return {
        "train_steps_per_s": round(statistics.median(rates_a), 3),
        "bare_steps_per_s": round(statistics.median(rates_b), 3),
        "ratio": round(statistics.median(a / b for a, b in zip(rates_a, rates_b)), 3),
        "peak_rss_mib_1x": 0.0, "peak_rss_mib_8x": 0.0, "rss_growth": 0.0,
        "same_weights": same_weights(trainer.model, bare.model),
        "pack": project.pack.id,
        "settings": {"steps": t.steps, "width": t.width, "depth": t.depth, "batch_size": t.batch_size,
                     "warmup": t.warmup, "log_every": t.log_every, "val_every": t.val_every,
                     "save_every": t.save_every,
                     "train_prompts": args.prompts, "scale": args.scale, "val_prompts": project.settings.corpus.n_val,
                     "parameters": sum(p.numel() for p in probe.model.parameters()), "rounds": args.rounds},
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "rounds_a": [round(x, 3) for x in rates_a],
        "rounds_b": [round(x, 3) for x in rates_b],
        "stage_ms": stage_ms,
        "stage_calls": timers.calls,     # the same in every round
        "minor_faults_per_step": {"A": [round(x) for x in faults_a], "B": [round(x) for x in faults_b]},
        "bare_ms": round(t.steps / statistics.median(rates_b) * 1e3, 1),
        "overhead_ms_per_step": round((1 / statistics.median(rates_a) - 1 / statistics.median(rates_b)) * 1e3, 2),
    }


def warm_up(trainer: Trainer, batches: list[Batch]) -> None:
    """First-call costs (kernels, allocator) paid before any timed round; the probe's own model."""
    for batch in batches:
        trainer.train_step(batch)
    trainer.validate()


def timed(device: torch.device, fn: Any, *args: Any) -> float:
    sync(device)
    started = time.perf_counter()
    fn(*args)
    sync(device)
    return time.perf_counter() - started


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def minor_faults() -> int:
    """Page faults served without I/O so far: fresh (or trimmed and re-touched) heap pages."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


class Timers:
    """Exclusive wall time inside wrapped methods, by part: a nested call (best.pt saved inside
    validate) counts only in the inner part. On CUDA each part synchronises the device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {part: 0.0 for part in (*STAGE_PARTS, "total")}
        self.calls: dict[str, int] = {part: 0 for part in STAGE_PARTS}
        self._inner: list[float] = []    # time spent in nested timed calls, per open call

    @contextlib.contextmanager
    def wrap(self, owner: Any, attr: str, part: str) -> Iterator[None]:
        original = getattr(owner, attr)

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            sync(self.device)
            started = time.perf_counter()
            self._inner.append(0.0)
            try:
                return original(*args, **kwargs)
            finally:
                sync(self.device)
                spent = time.perf_counter() - started
                self.seconds[part] += spent - self._inner.pop()
                self.calls[part] += 1
                if self._inner:
                    self._inner[-1] += spent

        setattr(owner, attr, timed_call)          # an instance attribute shadows the method
        try:
            yield
        finally:
            delattr(owner, attr)

    @contextlib.contextmanager
    def total(self) -> Iterator[None]:
        self.seconds["total"] = -time.perf_counter()
        try:
            yield
        finally:
            sync(self.device)
            self.seconds["total"] += time.perf_counter()


def profile_a(project: Project, path: str) -> None:
    profiler = cProfile.Profile()
    profiler.runcall(run_a, project)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(30)
    Path(path).write_text(out.getvalue(), encoding="utf-8")
    log(f"cProfile of one A round written to {path}")


# ------------------------------------------------------------ peak RSS, in fresh processes

def peak_rss_child(project: Project, args: argparse.Namespace) -> dict[str, Any]:
    """Train the project's stage once in a fresh interpreter; its peak RSS and stage facts."""
    shutil.rmtree(project.checkpoints_dir, ignore_errors=True)
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    command = [sys.executable, __file__, "--rss-child", str(project.root)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.no_heap_pad:
        command.append("--no-heap-pad")
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, check=True, text=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    log(f"RSS child on {figures['train_prompts']} train prompts in {figures['shards']} shards "
        f"({figures['train_shards_mib']} MiB): peak {figures['peak_rss_mib']} MiB, "
        f"{figures['ready_rss_mib']} MiB before train(), {figures['train_peak_rss_mib']} MiB peak inside it, "
        f"file-backed at most {figures['max_rss_file_mib']} MiB ({figures['seconds']} s)")
    return figures


def rss_child(root: Path, heap_settings: bool = True) -> int:
    """One stage run; peak RSS read from /proc/self/status, not ru_maxrss: a child started by a
    big parent inherits the parent's high-water mark in ru_maxrss (Linux sets it at exec from
    the address space it replaces), while VmHWM belongs to the child's own address space."""
    project = Project.open(root)
    trainer = Trainer(project, ListReport())
    if heap_settings and large_block_step(trainer):
        keep_large_blocks()                   # as the stage's process does
    most = sample_after_each_batch(trainer.stream, ("RssFile", "RssAnon"))
    setup_peak, ready = proc_status_mib("VmHWM"), proc_status_mib("VmRSS")
    reset = reset_peak_rss()                  # from here VmHWM is the peak of train() alone
    started = time.perf_counter()
    trainer.train(never)
    seconds = time.perf_counter() - started
    train_peak = proc_status_mib("VmHWM")
    print(json.dumps({"train_prompts": len(read_corpus(project.corpus_files()[0])),
                      "shards": len(trainer.stream.files), "steps": trainer.step,
                      "train_shards_mib": round(sum(f.stat().st_size for f in trainer.stream.files) / 2**20, 1),
                      "peak_rss_mib": round(max(setup_peak, train_peak), 1),
                      "ready_rss_mib": round(ready, 1),
                      "train_peak_rss_mib": round(train_peak, 1) if reset else None,
                      "end_rss_mib": round(proc_status_mib("VmRSS"), 1),
                      "max_rss_file_mib": round(most["RssFile"], 1), "max_rss_anon_mib": round(most["RssAnon"], 1),
                      "ru_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "seconds": round(seconds, 1)}))
    return 0


def sample_after_each_batch(stream: ShardStream, fields: tuple[str, ...]) -> dict[str, float]:
    """The most of each /proc/self/status field seen right after each training batch is read.
    RssFile holds the mapped shard pages the stream touched (plus the shared libraries, the
    same in every run), so it shows whether shards stay resident after the stream moves on."""
    most = {field: 0.0 for field in fields}
    next_batch = stream.next

    def sampled() -> Batch:
        batch = next_batch()
        for field in fields:
            most[field] = max(most[field], proc_status_mib(field))
        return batch

    stream.next = sampled    # type: ignore[method-assign]  # an instance attribute shadows the method
    return most


def proc_status_mib(field: str) -> float:
    """A memory field of this process (VmHWM: peak RSS, VmRSS: RSS now, ...), in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024      # kB
    raise RuntimeError(f"/proc/self/status has no {field}; the RSS figures need Linux")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def print_table(f: dict[str, Any]) -> None:
    s, ms = f["settings"], f["stage_ms"]
    log(f"\nwidth {s['width']}, depth {s['depth']}, batch {s['batch_size']}, {s['steps']} steps "
        f"(log/val/save every {s['log_every']}/{s['val_every']}/{s['save_every']}), {s['train_prompts']} train "
        f"prompts, on {f['device']} with {f['torch_threads']} torch threads; {s['rounds']} rounds (medians)")
    log(f"  A train stage   {f['train_steps_per_s']:>8.2f} steps/s")
    log(f"  B bare loop     {f['bare_steps_per_s']:>8.2f} steps/s   A/B {f['ratio']:.3f} (target >= 0.95); "
        f"same weights: {f['same_weights']}")
    log("  A, ms per run:  " + ", ".join(f"{k} {v}" for k, v in ms.items()) + f"; B {f['bare_ms']}")
    log(f"  stage overhead {f['overhead_ms_per_step']} ms per step")
    if not f["peak_rss_mib_1x"]:
        log("  peak RSS not measured (--no-rss)")
        return
    log(f"  peak RSS {f['peak_rss_mib_1x']} MiB (1x), {f['peak_rss_mib_8x']} MiB ({s['scale']}x): "
        f"x{f['rss_growth']}; inside train() x{f['train_rss_growth']}; file-backed "
        f"{f['rss_file_delta_mib']:+} MiB")


if __name__ == "__main__":
    sys.exit(main())
