"""The train stage at the reference size against the card's FLOP floor, and one precompute pass
of random teachers at realistic shapes.

    PYTHONPATH=. python bench/gpu.py [--device cuda|cpu] [--size reference|small] [--steps N]
        [--warmup N] [--prompts N] [--no-precompute] [--no-compile]

`--size reference` (the default on CUDA) is the LLaDA resampler of the issue: pig_clip's 1024-d
rows in, width 1024, depth 6, 256 queries of 2560-d out, batch 32, bf16 autocast; the student
rows are 40–200 tokens. `--size small` (the default on CPU) is width 128, depth 2, batch 8,
64-d rows, so the script also runs on a laptop or CI machine.

Train, on shards written at those shapes under a `llada_image` project (synthetic targets):

  stage          `Trainer.train` itself: the shard stream, metrics every 10 steps, no validation
                 or saves until the end (those are left out of the timing), eager
                 (`train_eager_steps_per_s`) and with train.compile on (`train_compile_steps_per_s`);
                 `train_steps_per_s` is the default's (compile on CUDA, eager on the CPU);
  step           `Trainer.train_step` on batches already on the device (no stream);
  step_fused     the same with `AdamW(fused=True)` (CUDA only);
  step_compile   the same with the adapter under `torch.compile` and the fused optimizer.

Each is warmed up, then timed over --steps steps between device synchronisations (the stage
between its metric records, which read the loss; --warmup and --steps are rounded to whole
metric intervals). The FLOPs of
one optimizer step come from `torch.utils.flop_counter` (matmuls and attention; elementwise work
is not counted); `peak_tflops` is a timed bf16 8192³ matmul on CUDA (f32 1024³ on CPU), so
`floor_steps_per_s` = peak / FLOPs per step is the rate at which the card would run the step if
it did nothing but matmuls at full speed, and `mfu` = stage rate / floor.

Precompute: the demo project with its student replaced by a 2-layer random Qwen3 at pig_clip's
widths (1024-d, 16 heads, 8 kv heads, 3072 MLP, full vocabulary) and its teacher by a 2-layer
random T5 at T5-XXL's widths (4096-d, 64 heads, 10240 FFN); the corpus and the val split run
first, then the train split is timed (`precompute_samples_per_s`). The last stdout line is one
JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from trainer_core.base.events import ListReport
from trainer_core.project import Project
from trainer_core.contract.shards import contract_for, shard_path, write_shard
from trainer_core.stages.base import never
from trainer_core.stages.train import Trainer
from trainer_core.contract.stream import Batch, ShardStream

SIZES = {
    "reference": {"in_dim": 1024, "width": 1024, "depth": 6, "batch": 32, "train_samples": 256, "val_samples": 64},
    "small": {"in_dim": 64, "width": 128, "depth": 2, "batch": 8, "train_samples": 48, "val_samples": 16},
}
SEED = 11


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), help="default: reference on CUDA, small on CPU")
    parser.add_argument("--steps", type=int, help="timed steps per variant (default 100 on CUDA, 10 on CPU)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 20 on CUDA, 3 on CPU)")
    parser.add_argument("--prompts", type=int, help="train prompts of the precompute pass (default 4096 / 240)")
    parser.add_argument("--no-precompute", action="store_true", help="skip the precompute pass")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here (use --device cpu)")
    args.size = args.size or ("reference" if cuda else "small")
    args.steps = args.steps or (100 if cuda else 10)
    args.warmup = args.warmup if args.warmup is not None else (20 if cuda else 3)
    args.prompts = args.prompts or (4096 if cuda else 240)
    if args.steps < 10 or args.warmup < 1:
        parser.error("--steps must be at least 10 and --warmup at least 1")
    # the stage is timed between metric records (each waits for the device): at least five
    # of them in the timed steps, the default 25 steps apart at most, the first at the warm-up's end
    args.log_every = min(25, args.steps // 5)
    args.warmup = -(-args.warmup // args.log_every) * args.log_every
    args.steps = args.steps // args.log_every * args.log_every
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------ train

def build_train_project(root: Path, args: argparse.Namespace) -> Project:
    """A llada_image project whose shards hold random rows at the size's shapes."""
    size = SIZES[args.size]
    project = Project.create(root, "llada_image")
    total = args.warmup + args.steps
    project.update_settings([
        "precompute.mock_teacher=true", f"train.device={args.device}", f"train.width={size['width']}",
        f"train.depth={size['depth']}", f"train.batch_size={size['batch']}", f"train.steps={total}",
        "train.warmup=5", f"train.log_every={args.log_every}", f"train.val_every={total}",
        f"train.save_every={total}",
    ])
    dims = project.pack.teacher_dims(project)
    g = torch.Generator().manual_seed(SEED)
    for split in ("train", "val"):
        n = size[f"{split}_samples"]
        folder = project.shards_dir(split)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "CONTRACT").write_text(contract_for(project) + "\n", encoding="utf-8")
        lens = torch.randint(40, 201, (n,), generator=g, dtype=torch.int32)
        t_len = torch.full((n,), dims["num_queries"], dtype=torch.int32)
        t_pack = (torch.randn(n * dims["num_queries"], dims["out_dim"], generator=g) * 2 + 0.5)
        t64 = t_pack.double()
        tensors = {
            "ids": torch.randint(0, 151_000, (int(lens.sum()),), generator=g, dtype=torch.int32), "len": lens,
            "q_pack": torch.randn(int(lens.sum()), size["in_dim"], generator=g).bfloat16(),
            "t_pack": t_pack.bfloat16(), "t_len": t_len,
            "stat_s": t64.sum(0), "stat_s2": (t64 * t64).sum(0), "stat_n": torch.tensor([t_pack.shape[0]]),
        }
        meta = {"pack": project.pack.id, "kind": "resampler", "contract": contract_for(project),
                "mock_teacher": True, "split": split, "shard": 0, "samples": n, "in_dim": size["in_dim"],
                "out_dim": dims["out_dim"], "num_queries": dims["num_queries"]}
        write_shard(shard_path(project, split, 0), tensors, meta, [f"bench prompt {i}" for i in range(n)])
    return project


def time_stage(project: Project, args: argparse.Namespace) -> tuple[float, Trainer]:
    """Steps/s of Trainer.train between its metric records after the warm-up (each record reads
    the accumulated loss, which waits for the device)."""
    trainer = Trainer(project, ListReport())
    marks: list[tuple[int, float]] = []
    record = trainer._record

    def timed_record(point: dict[str, Any]) -> None:
        record(point)
        marks.append((trainer.step, time.perf_counter()))
    trainer._record = timed_record      # type: ignore[method-assign]
    trainer.train(never)
    marks = [m for m in marks if m[0] >= args.warmup]
    (s0, t0), (s1, t1) = marks[0], marks[-1]
    return (s1 - s0) / (t1 - t0), trainer


def time_steps(trainer: Trainer, batches: list[Batch], args: argparse.Namespace) -> float:
    """Steps/s of train_step on device-resident batches."""
    for i in range(args.warmup):
        trainer.train_step(batches[i % len(batches)])
    sync(trainer.device)
    start = time.perf_counter()
    for i in range(args.steps):
        stats = trainer.train_step(batches[i % len(batches)])
    float(stats["loss"])
    sync(trainer.device)
    return args.steps / (time.perf_counter() - start)


def step_flops(trainer: Trainer, batch: Batch) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
        trainer.train_step(batch)
    return int(counter.get_total_flops())


def peak_tflops(device: torch.device) -> float:
    n, dtype, reps = (8192, torch.bfloat16, 10) if device.type == "cuda" else (1024, torch.float32, 5)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e12


def bench_train(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    project = build_train_project(root / "train", args)
    out: dict[str, Any] = {}
    for mode in ("off", "on"):            # the stage eager and compiled (train.compile; auto = on CUDA)
        if mode == "on" and args.no_compile:
            continue
        project.update_settings([f"train.compile={mode}"])
        shutil.rmtree(project.checkpoints_dir, ignore_errors=True)
        rate, trainer = time_stage(Project.open(project.root), args)
        out[f"train_{'compile' if mode == 'on' else 'eager'}_steps_per_s"] = round(rate, 3)
        if mode == "on":
            out["train_compile_active"] = trainer.compiled         # False: it fell back to eager
        log(f"  stage compile {mode:<3} {rate:8.2f} steps/s")
    project.update_settings(["train.compile=auto"])
    project = Project.open(project.root)
    auto = "on" if torch.device(args.device).type == "cuda" and not args.no_compile else "off"
    stage_rate = out["train_compile_steps_per_s" if auto == "on" else "train_eager_steps_per_s"]
    out["train_steps_per_s"] = stage_rate
    out["train_compile_default"] = auto
    project.update_settings(["train.compile=off"])       # the step variants below compile themselves
    project = Project.open(project.root)
    trainer = Trainer(project, ListReport())
    t = project.settings.train
    stream = ShardStream(sorted(project.shards_dir("train").glob("train-*.safetensors")), t.batch_size, t.seed)
    batches = [stream.next().to(trainer.device) for _ in range(4)]
    variants: list[tuple[str, Callable[[Trainer], None]]] = [("step", lambda tr: None)]
    if trainer.device.type == "cuda":
        variants.append(("step_fused", _fused))
        if not args.no_compile:
            variants.append(("step_compile", lambda tr: (_fused(tr), _compile(tr))))
    elif not args.no_compile:
        variants.append(("step_compile", _compile))
    for name, change in variants:
        fresh = Trainer(project, ListReport())
        try:
            change(fresh)
            rate = time_steps(fresh, batches, args)
        except Exception as e:     # a variant that does not run here (compiler missing, ...) is reported
            out[f"{name}_error"] = " ".join(str(e).split())[:300]
            log(f"  {name:<14} failed: {out[f'{name}_error']}")
            continue
        out[f"{name}_steps_per_s"] = round(rate, 3)
        log(f"  {name:<14} {rate:8.2f} steps/s")
    flops = step_flops(Trainer(project, ListReport()), batches[0])
    peak = peak_tflops(trainer.device)
    floor = peak * 1e12 / flops
    out.update(flops_per_step=flops, peak_tflops=round(peak, 3), floor_steps_per_s=round(floor, 2),
               mfu=round(stage_rate / floor, 4), stage_vs_step=round(stage_rate / out["step_steps_per_s"], 3),
               parameters=sum(p.numel() for p in trainer.model.parameters()),
               shapes={"in_dim": SIZES[args.size]["in_dim"], "out_dim": trainer.config.out_dim,
                       "num_queries": trainer.config.num_queries, "width": t.width, "depth": t.depth,
                       "batch": t.batch_size, "student_tokens": "40-200"})
    return out


def _fused(trainer: Trainer) -> None:
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    t = trainer.t
    trainer.optimizer = torch.optim.AdamW(params, lr=t.lr, betas=(0.9, 0.95), weight_decay=t.weight_decay, fused=True)


def _compile(trainer: Trainer) -> None:
    trainer.net = torch.compile(trainer.net, dynamic=True)


# ------------------------------------------------------------ precompute

def bench_precompute(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import Qwen3Model

    from trainer_core.demo.build import build_demo
    from trainer_core.demo.fixtures import demo_prompts
    from trainer_core.stages import corpus as corpus_stage
    from trainer_core.stages import precompute as precompute_stage
    from trainer_core.demo.fixtures import tiny_qwen3_config, write_student_config, write_student_gguf
    from trainer_core.packs.t5xxl_pixart.tiny import write_tiny_t5

    started = time.perf_counter()
    project = build_demo(root / "precompute", "t5xxl_pixart")
    materials = project.materials_dir
    prompts = demo_prompts(args.prompts + 400, seed=SEED)
    (materials / "bench_prompts.txt").write_text("".join(p + "\n" for p in prompts), encoding="utf-8")
    shapes = {"student": "demo (64-d, 2 layers)", "teacher": "demo (64-d, 2 layers)"}
    if args.size == "reference":
        config = tiny_qwen3_config(hidden_size=1024, layers=2, heads=16, kv_heads=8, head_dim=128, intermediate=3072)
        write_student_config(materials / "pig-clip-tokenizer", config)
        torch.manual_seed(SEED)
        write_student_gguf(Qwen3Model(config), materials / "pig_clip-demo-f16.gguf", dtype="f16")
        write_tiny_t5(project.pack.resolve_material(project, "teacher"), prompts[:2000], d_model=4096, layers=2,
                      heads=64, d_kv=64, d_ff=10240)
        shapes = {"student": "Qwen3 1024-d, 2 layers, 151936 vocab", "teacher": "T5 4096-d, 2 layers, 10240 FFN"}
    project.update_settings(["corpus.extra_files=materials/bench_prompts.txt", f"corpus.n_train={args.prompts}",
                             "corpus.n_val=200", f"precompute.device={args.device}", "precompute.shard_size=1024"])
    report = ListReport()
    corpus_stage.run(project, report)
    precompute_stage.run(project, report, split="val")
    log(f"  precompute setup {time.perf_counter() - started:.1f} s")
    sync(torch.device(args.device))
    start = time.perf_counter()
    precompute_stage.run(project, report, split="train")
    sync(torch.device(args.device))
    seconds = time.perf_counter() - start
    rate = args.prompts / seconds
    log(f"  precompute     {rate:8.1f} samples/s ({args.prompts} prompts, {seconds:.1f} s)")
    lines = [e.get("message", "") for e in report.of_type("log")]
    return {"precompute_samples_per_s": round(rate, 1), "precompute_prompts": args.prompts,
            "precompute_seconds": round(seconds, 2), "precompute_shapes": shapes,
            "precompute_log": [m for m in lines if m.startswith(("student", "teacher"))][-2:]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    figures: dict[str, Any] = {"device": args.device, "size": args.size, "steps": args.steps, "warmup": args.warmup,
                               "torch": torch.__version__}
    if device.type == "cuda":
        figures["gpu"] = torch.cuda.get_device_name(device)
    else:
        figures["torch_threads"] = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        os.environ["GGUF_TRAINER_HOME"] = str(Path(tmp) / "home")    # keep the user's last project
        log(f"train at the {args.size} size on {args.device}")
        figures.update(bench_train(Path(tmp), args))
        if device.type == "cuda":
            figures["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2)
        if not args.no_precompute:
            figures.update(bench_precompute(Path(tmp), args))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
