"""Precompute throughput: our shard path (A) against a bare forward loop (B), side by side.

    python bench/precompute.py [--prompts N] [--repeat R] [--device cpu|cuda] [--shard-size S]
                               [--threads T] [--profile FILE]

A demo project (trainer_core.demo) is built in a temp folder with N synthetic train prompts,
its corpus stage is run for real, and the student and teacher are loaded once with the
precompute stage's own `load_models`. Then, over the same train shards, rounds run
interleaved (warm-up A B, then A B A B ...):

  A  our path per shard: pack.make_shard + shards.write_shard into a scratch folder;
  B  the minimum work: the same teacher and student forwards on the same prompts with the
     same batch sizes, in corpus order: tokenize, pad, forward, discard.

The figures are medians over the rounds; `ratio` is the median of the per-pair A/B ratios,
so slow drift of the machine cancels. One more A round and B round then run with timers
around the model calls and the shard writer (`breakdown_ms`: milliseconds per round inside
each; nested, so make_shard includes the forwards, and A's `total` minus the calls is our
bookkeeping). The last line on stdout is one JSON object; the rest goes to stderr.
`--profile FILE` also runs one A round under cProfile and writes its cumulative table to FILE.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import resource
import shutil
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Iterator

import safetensors.torch
import torch

from trainer_core.contract import shards as shards_io
from trainer_core.contract.batching import greedy_batches
from trainer_core.demo import build_demo
from trainer_core.packs.common.tiny_models import demo_prompts
from trainer_core.base.errors import TrainerError
from trainer_core.base.events import ListReport
from trainer_core.project import Project
from trainer_core.contract.shards import contract_for, mock_enabled
from trainer_core.stages import corpus as corpus_stage
from trainer_core.contract.corpus_files import read_corpus
from trainer_core.stages.precompute import load_models
from trainer_core.packs import DEMO_PACKS
from trainer_core.packs.lookup import format_prompt

BENCH_SEED = 7  # the synthetic corpus; the demo's own prompts use trainer_core.demo.SEED


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-precompute-") as tmp:
        try:
            bench = Bench.build(Path(tmp), args)
        except TrainerError as e:   # e.g. --device cuda on a machine without one
            log(f"bench/precompute.py: {e}")
            return 2
        figures = bench.measure(args.repeat)
        figures["breakdown_ms"] = bench.breakdown()
        if args.profile:
            bench.profile_a(args.profile)
    figures["peak_rss_mib"] = round(peak_rss_mib(), 1)
    print_table(figures)
    print(json.dumps(figures, sort_keys=False))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4000, help="train prompts (default 4000)")
    parser.add_argument("--repeat", type=int, default=9, help="timed A/B pairs (default 9)")
    parser.add_argument("--device", default="", help="overrides precompute.device (the demo sets cpu)")
    parser.add_argument("--shard-size", type=int, default=0,
                        help="overrides precompute.shard_size (the demo sets 120)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--profile", default="", help="write a cProfile table of one A round here")
    args = parser.parse_args(argv)
    if args.prompts < 100 or args.repeat < 1:
        parser.error("--prompts must be at least 100 (the corpus stage needs them) and --repeat at least 1")
    return args


class Bench:
    """The loaded models, the train shards' prompts and, per shard, B's batch sizes."""

    def __init__(self, project: Project, student: Any, teacher: Any, device: torch.device,
                 shards: list[list[str]]):
        self.project, self.student, self.teacher, self.device = project, student, teacher, device
        self.pack = project.pack
        self.budgets = self.pack.budgets(project, device)
        self.shards = shards
        self.scratch = project.root / "bench-shards"
        self.plans = [self._batch_sizes(prompts) for prompts in shards]

    @classmethod
    def build(cls, tmp: Path, args: argparse.Namespace) -> "Bench":
        project = build_demo(tmp / "project", DEMO_PACKS[0])         # the first demo: a tiny real T5 teacher
        prompt_file = project.materials_dir / "bench_prompts.txt"
        n_val = project.settings.corpus.n_val
        # the demo's word lists, on whose prompts the demo's T5 vocabulary was trained
        prompts = demo_prompts(args.prompts + n_val + 200, seed=BENCH_SEED)
        prompt_file.write_text("".join(p + "\n" for p in prompts), encoding="utf-8")
        settings = [f"corpus.extra_files=materials/demo_prompts.txt,{prompt_file.relative_to(project.root)}",
                    f"corpus.n_train={args.prompts}"]
        if args.device:
            settings.append(f"precompute.device={args.device}")
        if args.shard_size:
            settings.append(f"precompute.shard_size={args.shard_size}")
        project.update_settings(settings)
        report = ListReport()
        corpus_stage.run(project, report)
        corpus = read_corpus(project.corpus_files()[0])
        size = project.settings.precompute.shard_size
        shards = [corpus[i:i + size] for i in range(0, len(corpus), size)]
        student, teacher, device = load_models(project, report)
        return cls(project, student, teacher, device, shards)

    def _batch_sizes(self, prompts: list[str]) -> tuple[list[int], list[int]]:
        """(teacher, student) batch sizes A uses on this shard: greedy over sorted lengths."""
        _, lens = self.teacher.seed_windows(prompts)                           # [S]
        teacher = greedy_batches(sorted(lens.tolist()), self.budgets.teacher_batch, self.budgets.tok_budget)
        max_len = self.pack.max_len_student
        lengths = sorted(min(len(self.student.tokenize(format_prompt(self.pack, p))), max_len) for p in prompts)
        student = greedy_batches(lengths, self.budgets.student_batch, self.budgets.student_tok_budget)
        return [len(b) for b in teacher], [len(b) for b in student]

    # ------------------------------------------------------------ the two paths

    def run_a(self, round_: int) -> None:
        """Our path: make_shard + write_shard per train shard, as stages.precompute.run does."""
        folder = self.scratch / f"round-{round_}"
        for index, prompts in enumerate(self.shards):
            tensors, extra = self.pack.make_shard(prompts, self.student, self.teacher, self.budgets)
            meta = {"pack": self.pack.id, "kind": self.pack.adapter_kind, "contract": contract_for(self.project),
                    "mock_teacher": mock_enabled(self.project), "teacher_mode": getattr(self.teacher, "mode", ""),
                    "student": "bench", "split": "train", "shard": index, "samples": len(prompts),
                    "in_dim": int(tensors["q_pack"].shape[1]), "out_dim": int(tensors["t_pack"].shape[1]),
                    "num_queries": extra.get("num_queries", 0), "storage": "bf16"}
            shards_io.write_shard(folder / f"train-{index:05d}.safetensors", tensors, meta, extra["prompts"])

    def run_b(self) -> None:
        """The minimum: tokenize, pad, forward, discard, in corpus order, same batch sizes."""
        max_len = self.pack.max_len_student
        for prompts, (teacher_sizes, student_sizes) in zip(self.shards, self.plans):
            for chunk in _chunks(prompts, teacher_sizes):
                ids, lens = self.teacher.seed_windows(chunk)                   # [b, 120], [b]
                self.teacher.forward(ids, lens)                                # [b, L, out]
            for chunk in _chunks(prompts, student_sizes):
                tokens = [self.student.tokenize(format_prompt(self.pack, p))[:max_len] for p in chunk]
                ids, mask = self.student.batch(tokens)                         # [b, L]
                self.student.hidden(ids, mask)                                 # [b, L, H]
        self._sync()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------ measuring

    def measure(self, repeat: int) -> dict[str, Any]:
        samples = sum(len(s) for s in self.shards)
        self._timed(self.run_a, 0), self._timed(self.run_b)                   # warm-up, not counted
        rates_a, rates_b = [], []
        for r in range(1, repeat + 1):
            rates_a.append(samples / self._timed(self.run_a, r))
            shutil.rmtree(self.scratch)                                        # keeps the disk flat
            rates_b.append(samples / self._timed(self.run_b))
            log(f"round {r}: A {rates_a[-1]:.1f} samples/s, B {rates_b[-1]:.1f} samples/s, "
                f"A/B {rates_a[-1] / rates_b[-1]:.3f}")
        return {
            "precompute_samples_per_s": round(statistics.median(rates_a), 1),
            "bare_samples_per_s": round(statistics.median(rates_b), 1),
            "ratio": round(statistics.median(a / b for a, b in zip(rates_a, rates_b)), 3),
            "peak_rss_mib": 0.0,
            "prompts": samples,
            "shards": len(self.shards),
            "device": str(self.device),
            "torch_threads": torch.get_num_threads(),
            "repeat": repeat,
            "shard_size": self.project.settings.precompute.shard_size,
            "teacher_batch": self.budgets.teacher_batch,
            "student_batch": self.budgets.student_batch,
            "rounds_a": [round(x, 1) for x in rates_a],
            "rounds_b": [round(x, 1) for x in rates_b],
        }

    def _timed(self, fn: Any, *args: Any) -> float:
        self._sync()
        started = time.perf_counter()
        fn(*args)
        self._sync()
        return time.perf_counter() - started

    def breakdown(self) -> dict[str, dict[str, float]]:
        """Milliseconds per round spent inside each model call and in the shard writer, for one
        extra A round and one B round; `other` is what the path spends outside those calls."""
        out = {}
        for name, fn, args in (("A", self.run_a, (20_000,)), ("B", self.run_b, ())):
            timers = Timers()
            with timers.wrap(self.teacher, "seed_windows", "t5_tokenize"), \
                    timers.wrap(self.teacher, "forward", "teacher_forward"), \
                    timers.wrap(self.student, "tokenize", "student_tokenize"), \
                    timers.wrap(self.student, "batch", "student_pad"), \
                    timers.wrap(self.student, "hidden", "student_forward"), \
                    timers.wrap(self.student, "rows", "student_rows"), \
                    timers.wrap(self.pack, "make_shard", "make_shard"), \
                    timers.wrap(shards_io, "write_shard", "write_shard"), \
                    timers.wrap(safetensors.torch, "save_file", "save_file"):
                total = self._timed(fn, *args)
            out[name] = {k: round(v * 1e3, 1) for k, v in timers.seconds.items()}
            out[name]["total"] = round(total * 1e3, 1)
        return out

    def profile_a(self, path: str) -> None:
        profiler = cProfile.Profile()
        profiler.runcall(self.run_a, 10_000)
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(60)
        Path(path).write_text(out.getvalue(), encoding="utf-8")
        log(f"cProfile of one A round written to {path}")


class Timers:
    """Wall time spent inside wrapped callables, by label (nested calls count in both)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def wrap(self, owner: Any, attr: str, label: str) -> Iterator[None]:
        original = getattr(owner, attr)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - started
        self.seconds.setdefault(label, 0.0)
        _set(owner, attr, timed)
        try:
            yield
        finally:
            _unset(owner, attr, original)


def _set(owner: Any, attr: str, value: Any) -> None:
    if isinstance(owner, types.ModuleType):
        setattr(owner, attr, value)
    else:
        object.__setattr__(owner, attr, value)   # the pack is a frozen dataclass


def _unset(owner: Any, attr: str, original: Any) -> None:
    if isinstance(owner, types.ModuleType):
        setattr(owner, attr, original)
    else:
        object.__delattr__(owner, attr)      # back to the class's method


def _chunks(items: list[str], sizes: list[int]) -> list[list[str]]:
    out, start = [], 0
    for size in sizes:
        out.append(items[start:start + size])
        start += size
    return out


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux reports KiB


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def print_table(f: dict[str, Any]) -> None:
    log(f"\n{f['prompts']} prompts in {f['shards']} shards of {f['shard_size']} on {f['device']}, "
        f"{f['torch_threads']} torch threads, {f['repeat']} rounds (medians)")
    log(f"  A precompute (make_shard + write_shard)  {f['precompute_samples_per_s']:>9.1f} samples/s")
    log(f"  B bare forwards                          {f['bare_samples_per_s']:>9.1f} samples/s")
    log(f"  A/B {f['ratio']:.3f}  (target >= 0.9)   peak RSS {f['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    sys.exit(main())
