"""The train stage at the reference size against the card's FLOP floor, and one precompute pass
of random teachers at realistic shapes.

    PYTHONPATH=. python bench/gpu.py [--device cuda|cpu] [--size reference|small] [--steps N]
        [--warmup N] [--prompts N] [--no-precompute] [--no-compile]

`--size reference` (the default on CUDA) is the LLaDA resampler of the issue: pig_clip's 1024-d
rows in, width 1024, depth 6, 256 queries of 2560-d out, batch 32, bf16 autocast; the student
rows are 40–200 tokens. `--size small` (the default on CPU) is width 128, depth 2, batch 8,
64-d rows, so the script also runs on a laptop or CI machine.

Train, on shards written at those shapes under a project of the registry's default pack (`DEFAULT_PACK`,
the reference project.json's: llada_image; synthetic targets):

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

Precompute: the first demo project whose teacher is a T5 (PixArt) with its student replaced by a 2-layer random Qwen3 at pig_clip's
widths (1024-d, 16 heads, 8 kv heads, 3072 MLP, full vocabulary) and its teacher by a 2-layer
random T5 at T5-XXL's widths (4096-d, 64 heads, 10240 FFN); the corpus and the val split run
first, then the train split is timed (`precompute_samples_per_s`). The last stdout line is one
JSON object.

    PYTHONPATH=. python bench/gpu.py --size real [--pack ID ...] [--prompts N] [--steps N] [--smoke [--tiny]]

`--size real`: one pack per published teacher config (`REAL_TEACHERS`, by the pack's teacher_repo; the
first demo that reads it: t5xxl_pixart, llada_image, qwen3vl_mageflow, qwen3vl_qwenimage), each in a child
process of its own. The teacher is written with random bf16
weights in its real layout (T5-XXL v1.1's encoder; Qwen3-VL-4B / -8B-Instruct through transformers'
classes; LLaDA2-MoE through the project's stand-in backbone, trainer_core/packs/llada_image/tiny_model,
with its 256 experts, 8 active, plus QueryFormer and text_projection at their real sizes), the student
at pig_clip's (Qwen3-0.6B, 151,936-token vocabulary), and the project's own stages run: the corpus,
precompute val (loads the models, untimed), precompute train timed (`precompute_samples_per_s`) at
each teacher placement on CUDA (precompute.placement sequential / balanced for a pack placed by it,
`teacher_control`: LLaDA; precompute.teacher_mode gpu / offload for the others; a placement that fails is reported, the best
one is the pack's figure), then the train stage at the pack's reference size on those shards, eager
and compiled, with FLOPs per step, the matmul peak and MFU as above. Per pack: `teacher_params` (the
published config's count, on the meta device), `peak_memory` (ru_maxrss and max allocated per CUDA
device, of the best placement), `train_20k_min`. `--smoke`: the same path on the CPU at one layer a
stack (LLaDA: its dense layer and one MoE layer), one adapter block at batch 2, 2 steps, eager
(`python -m pytest -m slow` runs it with --prompts 8 so the script cannot rot; its figures mean
nothing). `--smoke --tiny`: that path at toy widths (the published layouts, vocabularies and expert
routing kept), in seconds: the default test suite's run.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

from trainer_core.base.events import ListReport
from trainer_core.project import Project
from trainer_core.contract.shards import contract_for, shard_path, write_shard
from trainer_core.stages.base import never
from trainer_core.stages.train import Trainer
from trainer_core.contract.stream import Batch, ShardStream
from trainer_core.packs import DEFAULT_PACK, DEMO_PACKS, PACKS
from trainer_core.packs.lookup import resolve_material

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
    parser.add_argument("--size", choices=[*sorted(SIZES), "real"],
                        help="default: reference on CUDA, small on CPU; real: every pack at its published config")
    parser.add_argument("--steps", type=int, help="timed steps per variant (default 100 on CUDA, 10 on CPU, 2 smoke)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 20 on CUDA, 3 on CPU, 1 smoke)")
    parser.add_argument("--prompts", type=int, help="train prompts of the precompute pass (default 4096 / 240; "
                                                    "real: 1024, smoke 16)")
    parser.add_argument("--no-precompute", action="store_true", help="skip the precompute pass")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    parser.add_argument("--pack", nargs="*", choices=REAL_PACKS, default=list(REAL_PACKS),
                        help="--size real: the packs to measure (default: one per published teacher)")
    parser.add_argument("--smoke", action="store_true",
                        help="--size real on the CPU at one layer per model, 2 steps, eager (the test suite's run)")
    parser.add_argument("--tiny", action="store_true",
                        help="with --size real --smoke: toy widths, the same path in seconds (the default test run)")
    parser.add_argument("--one", choices=REAL_PACKS, help=argparse.SUPPRESS)      # a child process: one pack
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here (use --device cpu)")
    if args.smoke and args.size != "real":
        parser.error("--smoke goes with --size real")
    if args.tiny and not args.smoke:
        parser.error("--tiny goes with --size real --smoke")
    if args.tiny:
        use_tiny_widths()
    if args.size == "real":
        if args.smoke and cuda:
            parser.error("--smoke runs on the CPU (--device cpu)")
        if args.smoke:
            args.no_compile = True
        args.steps = args.steps or (2 if args.smoke else 100 if cuda else 10)
        args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 20 if cuda else 3)
        args.prompts = args.prompts or (16 if args.smoke else 1024)
        if args.steps < 1 or args.warmup < 1:
            parser.error("--steps and --warmup must be at least 1")
        args.log_every = max(1, min(25, args.steps // 5))
        args.warmup = -(-args.warmup // args.log_every) * args.log_every
        args.steps = max(args.log_every, args.steps // args.log_every * args.log_every)
        return args
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
    """A project of the registry's default pack (the reference project.json's: LLaDA's resampler) whose shards
    hold random rows at the size's shapes."""
    size = SIZES[args.size]
    project = Project.create(root, DEFAULT_PACK)
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
                       "num_queries": trainer.config.spec.step_rows(trainer.config), "width": t.width, "depth": t.depth,
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

    from trainer_core.demo import build_demo
    from trainer_core.packs.common.tiny_models import demo_prompts
    from trainer_core.stages import corpus as corpus_stage
    from trainer_core.stages import precompute as precompute_stage
    from trainer_core.packs.common.tiny_models import tiny_qwen3_config, write_student_config, write_student_gguf
    from trainer_core.packs.common.t5.tiny import write_tiny_t5

    started = time.perf_counter()
    project = build_demo(root / "precompute", first_demo_of("t5"))
    materials = project.materials_dir
    prompts = demo_prompts(args.prompts + 400, seed=SEED)
    (materials / "bench_prompts.txt").write_text("".join(p + "\n" for p in prompts), encoding="utf-8")
    shapes = {"student": "demo (64-d, 2 layers)", "teacher": "demo (64-d, 2 layers)"}
    if args.size == "reference":
        config = tiny_qwen3_config(hidden_size=1024, layers=2, heads=16, kv_heads=8, head_dim=128, intermediate=3072)
        write_student_config(materials / "pig-clip-tokenizer", config)
        torch.manual_seed(SEED)
        write_student_gguf(Qwen3Model(config), materials / "pig_clip-demo-f16.gguf", dtype="f16")
        write_tiny_t5(resolve_material(project, "teacher"), prompts[:2000], d_model=4096, layers=2,
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


# ------------------------------------------------------------ --size real

# The published configs of the teachers (random weights), by the teacher repo a pack declares
# (`teacher_repo`): T5-XXL v1.1's encoder; Qwen3-VL-4B/-8B-Instruct; LLaDA2-MoE (LLaDA2.0-mini: the
# Ling-mini-2.0 Bailing-MoE layout of packs-contract-more §D.1, 2048-d, 20 layers, GQA 16/4, one dense layer
# then 256 experts of 512 with 8 active in 4 of 8 groups and a shared one, the 157,184-token vocabulary) with
# QueryFormer and text_projection at the defaults of packs-contract §B.1; pig_clip = Qwen3-0.6B. A family
# ("t5", "llada2", "qwen3vl") says how the teacher is written and counted.
T5_XXL = {"d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24, "num_heads": 64, "vocab_size": 32128}
_QWEN3VL_TEXT = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "max_position_embeddings": 262144,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                                     "mrope_interleaved": True}}
REAL_TEACHERS: dict[str, dict[str, Any]] = {
    "callgg/t5-v1_1-xxl-encoder-bf16": {"family": "t5", "name": "T5-XXL v1.1 encoder"},
    "inclusionAI/LLaDA-Image-Turbo": {"family": "llada2", "name": "LLaDA2-MoE"},
    "Qwen/Qwen3-VL-4B-Instruct": {
        "family": "qwen3vl", "name": "Qwen3-VL-4B",
        "text": {**_QWEN3VL_TEXT, "hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True},
        "vision": {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
                   "out_hidden_size": 2560, "deepstack_visual_indexes": [5, 11, 17]}},
    "Qwen/Qwen3-VL-8B-Instruct": {
        "family": "qwen3vl", "name": "Qwen3-VL-8B",
        "text": {**_QWEN3VL_TEXT, "hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False},
        "vision": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                   "out_hidden_size": 4096, "deepstack_visual_indexes": [8, 16, 24]}},
}


def real_teacher(pack: str) -> dict[str, Any]:
    return REAL_TEACHERS[PACKS[pack].teacher_repo]


def _real_packs() -> tuple[str, ...]:
    """One pack per published teacher above (a teacher costs the same whichever pack reads it): the first demo
    whose teacher it is, in demo order."""
    seen: set[str] = set()
    out = []
    for pack in DEMO_PACKS:
        repo = PACKS[pack].teacher_repo
        if repo in REAL_TEACHERS and repo not in seen:
            seen.add(repo)
            out.append(pack)
    return tuple(out)


def first_demo_of(family: str) -> str:
    """The first demo pack whose teacher is of `family`."""
    return next(p for p in DEMO_PACKS if REAL_TEACHERS.get(PACKS[p].teacher_repo, {}).get("family") == family)


REAL_PACKS = _real_packs()
LLADA2 = {"hidden": 2048, "layers": 20, "heads": 16, "head_dim": 128, "intermediate": 5120, "vocab_size": 157184,
          "backbone": {"num_key_value_heads": 4, "num_experts": 256, "num_experts_per_tok": 8,
                       "moe_intermediate_size": 512, "num_shared_experts": 1, "first_k_dense_replace": 1,
                       "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5},
          "num_queries": 256, "qf_heads": 16, "qf_inner": 8192, "proj_dim": 2560, "tp_layers": 6, "tp_heads": 32,
          "tp_inner": 8960}
PIG_CLIP = {"hidden_size": 1024, "layers": 28, "heads": 16, "kv_heads": 8, "head_dim": 128, "intermediate": 3072}


def use_tiny_widths() -> None:
    """`--tiny`: the same configs at toy widths (the published layouts, vocabularies and expert routing kept),
    so a smoke run takes the whole --size real path in seconds: what the default test suite runs."""
    global T5_XXL, LLADA2, PIG_CLIP
    T5_XXL = {**T5_XXL, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4}
    text = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "hidden_size": 64, "intermediate_size": 128,
            "rope_parameters": {**_QWEN3VL_TEXT["rope_parameters"], "mrope_section": [2, 3, 3]}}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
              "deepstack_visual_indexes": [0]}
    for repo, real in REAL_TEACHERS.items():
        if real["family"] == "qwen3vl":
            REAL_TEACHERS[repo] = {**real, "text": {**real["text"], **text}, "vision": {**real["vision"], **vision}}
    LLADA2 = {**LLADA2, "hidden": 64, "layers": 2, "heads": 4, "head_dim": 16, "intermediate": 128, "qf_heads": 4,
              "qf_inner": 128, "proj_dim": 64, "tp_layers": 1, "tp_heads": 4, "tp_inner": 128,
              "backbone": {**LLADA2["backbone"], "num_key_value_heads": 2, "num_experts": 8, "num_experts_per_tok": 2,
                           "moe_intermediate_size": 32, "n_group": 2, "topk_group": 1}}
    PIG_CLIP = {"hidden_size": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 128}
# the image packs' corpus (a smoke run: small reference areas so the CPU gets through it)
IMAGE_CORPUS = {"n_image": 0.5, "n_two": 0.05, "n_text": 0.45}
SMOKE_AREAS = ("corpus.ref_areas=[[16384, 0.5], [36864, 0.5]]", "corpus.two_image_max_area=16384")


def real_teacher_params(pack: str) -> int:
    """Parameters of the pack's teacher at its published config, counted on the meta device (nothing allocated)."""
    family = real_teacher(pack)["family"]
    with torch.device("meta"):
        if family == "t5":
            from transformers import T5Config, T5EncoderModel
            model = T5EncoderModel(T5Config(**T5_XXL, feed_forward_proj="gated-gelu", is_encoder_decoder=False))
            return sum(p.numel() for p in model.parameters())
        if family == "llada2":
            from trainer_core.packs.llada_image.teacher import QueryFormer, TextProjection
            from trainer_core.packs.llada_image.tiny_model.configuration_tiny_llada import TinyLLaDAConfig
            from trainer_core.packs.llada_image.tiny_model.modeling_tiny_llada import TinyLLaDAForEncoding
            from trainer_core.packs.common.rope_guard import default_rope
            c = LLADA2
            config = TinyLLaDAConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden"],
                                     intermediate_size=c["intermediate"], num_hidden_layers=c["layers"],
                                     num_attention_heads=c["heads"], head_dim=c["head_dim"], **c["backbone"])
            with default_rope():
                parts = [TinyLLaDAForEncoding(config)]
            parts.append(QueryFormer({"hidden_size": c["hidden"], "num_queries": c["num_queries"],
                                      "num_attention_heads": c["qf_heads"], "intermediate_size": c["qf_inner"],
                                      "norm_eps": 1e-6, "num_hidden_layers": 1}, blocks="layers"))
            parts.append(TextProjection({"hidden_size": c["hidden"], "intermediate_size": c["tp_inner"],
                                         "num_attention_heads": c["tp_heads"], "norm_eps": 1e-6,
                                         "num_hidden_layers": c["tp_layers"], "projection_dim": c["proj_dim"]}))
            return sum(p.numel() for part in parts for p in part.parameters())
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
        real = real_teacher(pack)
        config = Qwen3VLConfig(text_config={"vocab_size": 151936, **real["text"]},
                               vision_config={"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                                              "num_position_embeddings": 2304, **real["vision"]},
                               tie_word_embeddings=real["text"]["tie_word_embeddings"])
        return sum(p.numel() for p in Qwen3VLForConditionalGeneration(config).parameters())


def write_real_teacher(pack: str, folder: Path, smoke: bool, texts: list[str]) -> str:
    """The pack's teacher snapshot at its published widths (all its layers, or one per stack in a smoke
    run: LLaDA keeps its dense layer and one MoE layer), bf16 on disk; returns a one-line description."""
    from trainer_core.packs.llada_image.tiny import write_tiny_llada
    from trainer_core.packs.common.qwen3vl.tiny import write_tiny_qwen3vl
    from trainer_core.packs.common.t5.tiny import write_tiny_t5
    real = real_teacher(pack)
    if real["family"] == "t5":
        layers = 1 if smoke else T5_XXL["num_layers"]
        write_tiny_t5(folder, texts, d_model=T5_XXL["d_model"], layers=layers, heads=T5_XXL["num_heads"],
                      d_kv=T5_XXL["d_kv"], d_ff=T5_XXL["d_ff"], dtype=torch.bfloat16)
        return f"T5-XXL v1.1 encoder layout, {T5_XXL['d_model']}-d, {layers} layer(s)"
    if real["family"] == "llada2":
        c = LLADA2
        layers = 1 + c["backbone"]["first_k_dense_replace"] if smoke else c["layers"]
        write_tiny_llada(folder, hidden=c["hidden"], layers=layers, heads=c["heads"], head_dim=c["head_dim"],
                         num_queries=c["num_queries"], proj_dim=c["proj_dim"], qf_heads=c["qf_heads"],
                         qf_inner=c["qf_inner"], tp_layers=1 if smoke else c["tp_layers"], tp_heads=c["tp_heads"],
                         tp_inner=c["tp_inner"], vocab_size=c["vocab_size"], intermediate=c["intermediate"],
                         backbone=c["backbone"], dtype=torch.bfloat16)
        return (f"LLaDA2-MoE layout, {c['hidden']}-d, {layers} backbone layer(s) ({c['backbone']['num_experts']} "
                f"experts, {c['backbone']['num_experts_per_tok']} active)")
    text, vision = dict(real["text"]), dict(real["vision"])
    if smoke:
        text["num_hidden_layers"], vision["depth"], vision["deepstack_visual_indexes"] = 1, 1, [0]
    write_tiny_qwen3vl(folder, text=text, vision=vision, dtype=torch.bfloat16, max_shard_size="4GB")
    return f"{real['name']} layout, {text['hidden_size']}-d, {text['num_hidden_layers']} text / {vision['depth']} vision layer(s)"


def write_real_student(materials: Path, smoke: bool) -> tuple[Path, Path]:
    """pig_clip's config (Qwen3-0.6B; one layer in a smoke run) as an f16 GGUF + its tokenizer folder."""
    from transformers import Qwen3Model

    from trainer_core.packs.common.tiny_models import tiny_qwen3_config, write_qwen_tokenizer, write_student_config
    from trainer_core.packs.common.tiny_models import write_student_gguf
    c = PIG_CLIP
    config = tiny_qwen3_config(hidden_size=c["hidden_size"], layers=1 if smoke else c["layers"], heads=c["heads"],
                               kv_heads=c["kv_heads"], head_dim=c["head_dim"], intermediate=c["intermediate"])
    tokenizer = materials / "pig-clip-tokenizer"
    write_qwen_tokenizer(tokenizer)
    write_student_config(tokenizer, config)
    torch.manual_seed(SEED)
    gguf = write_student_gguf(Qwen3Model(config), materials / "pig_clip-real-f16.gguf", dtype="f16")
    return gguf, tokenizer


def write_real_models(pack: str, teacher: Path, materials: Path, smoke: bool,
                      texts: list[str], tiny: bool = False) -> tuple[str, Path, Path]:
    """(the teacher's description, the student GGUF, its tokenizer folder), all written (in a spawned
    process, which imports this module afresh: `tiny` sets the toy widths there too)."""
    if tiny:
        use_tiny_widths()
    return (write_real_teacher(pack, teacher, smoke, texts), *write_real_student(materials, smoke))


def teacher_modes(pack: str, device: torch.device) -> list[str]:
    """The precompute settings that place the teacher, each measured on CUDA (the plan refuses what does
    not fit and the run reports it); the pack's default alone on the CPU."""
    if device.type != "cuda":
        return []
    if PACKS[pack].teacher_control == "placement":
        return ["precompute.placement=sequential", "precompute.placement=balanced"]
    return ["precompute.teacher_mode=gpu", "precompute.teacher_mode=offload"]


def peak_memory(device: torch.device) -> dict[str, float]:
    import resource
    out = {"cpu_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)}
    if device.type == "cuda":
        for i in range(torch.cuda.device_count()):
            out[f"cuda:{i}_gib"] = round(torch.cuda.max_memory_allocated(i) / 2 ** 30, 2)
    return out


def bench_real_pack(pack: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One pack at its real size in this process: write the models, the corpus stage, precompute val
    (loads the models, untimed), then train timed per teacher placement, then the train stage."""
    from trainer_core.packs.common.tiny_models import demo_prompts, write_demo_images
    from trainer_core.stages import corpus as corpus_stage
    from trainer_core.stages import precompute as precompute_stage

    device = torch.device(args.device)
    out: dict[str, Any] = {"teacher_params": real_teacher_params(pack)}
    started = time.perf_counter()
    project = Project.create(root / pack, pack)
    materials = project.materials_dir
    materials.mkdir(parents=True, exist_ok=True)
    n_val = max(8, args.prompts // 8)
    prompts = demo_prompts(args.prompts + n_val, seed=SEED)
    teacher = resolve_material(project, "teacher")
    # written in a process of its own: building a 16B model's weights must not count in this one's peak RSS
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        out["teacher"], gguf, tokenizer = pool.submit(write_real_models, pack, teacher, materials, args.smoke,
                                                      prompts, args.tiny).result()
    settings = [f"materials.teacher.path={teacher}", f"materials.student.path={gguf}",
                f"materials.student_tokenizer.path={tokenizer}", f"precompute.device={args.device}",
                f"train.device={args.device}"]
    if project.pack.corpus_kind.reference_images:
        write_demo_images(materials / "bench_images", max(16, args.prompts // 2), SEED)
        counts = {k: max(1, round(v * args.prompts)) for k, v in IMAGE_CORPUS.items()}
        (materials / "prompts.txt").write_text("".join(p + "\n" for p in prompts), encoding="utf-8")
        settings += ["corpus.image_presets=[]", "corpus.presets=[]", "corpus.image_folders=materials/bench_images",
                     "corpus.extra_files=[\"materials/prompts.txt\"]",
                     *(f"corpus.{k}={v}" for k, v in counts.items()), f"corpus.n_val_image={n_val // 2}",
                     f"corpus.n_val_text={n_val - n_val // 2}", *(SMOKE_AREAS if args.smoke else ())]
    else:
        (materials / "train.txt").write_text("".join(p + "\n" for p in prompts[:args.prompts]), encoding="utf-8")
        (materials / "val.txt").write_text("".join(p + "\n" for p in prompts[args.prompts:]), encoding="utf-8")
        settings += ["corpus.mode=files", "corpus.train_file=materials/train.txt", "corpus.val_file=materials/val.txt"]
    project.update_settings(settings)
    report = ListReport()
    corpus_stage.run(Project.open(project.root), report)
    samples = sum(1 for _ in open(project.root / "data" / "train.jsonl", encoding="utf-8")) \
        if (project.root / "data" / "train.jsonl").is_file() else args.prompts
    out["setup_s"] = round(time.perf_counter() - started, 1)
    log(f"{pack}: {out['teacher']}; setup {out['setup_s']} s")
    runs: dict[str, Any] = {}
    for mode in teacher_modes(pack, device) or ["default"]:
        if mode != "default":
            project.update_settings([mode])
        for split in ("val", "train"):
            shutil.rmtree(project.shards_dir(split), ignore_errors=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            for i in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(i)
        shared: dict[str, Any] = {}
        opened = Project.open(project.root)
        try:
            precompute_stage.run(opened, report, split="val", shared=shared)     # loads the models
            sync(device)
            start = time.perf_counter()
            precompute_stage.run(opened, report, split="train", shared=shared)
            sync(device)
        except Exception as e:        # a placement that does not fit this card is a figure too
            runs[mode] = {"error": " ".join(str(e).split())[:300]}
            log(f"  precompute {mode}: failed: {runs[mode]['error']}")
            continue
        finally:
            shared.clear()
        seconds = time.perf_counter() - start
        runs[mode] = {"precompute_samples_per_s": round(samples / seconds, 2), "seconds": round(seconds, 2),
                      "peak_memory": peak_memory(device)}
        log(f"  precompute {mode}: {runs[mode]['precompute_samples_per_s']} samples/s")
    done = {m: r for m, r in runs.items() if "precompute_samples_per_s" in r}
    if not done:
        raise SystemExit(f"{pack}: no teacher placement ran: {runs}")
    best = max(done, key=lambda m: done[m]["precompute_samples_per_s"])
    out.update(precompute_samples_per_s=done[best]["precompute_samples_per_s"], precompute_best=best,
               precompute_samples=samples, precompute=runs, peak_memory=done[best]["peak_memory"])
    out.update(real_train(Project.open(project.root), args))
    out["train_20k_min"] = round(20000 / out["train_steps_per_s"] / 60, 2)
    return out


def real_train(project: Project, args: argparse.Namespace) -> dict[str, Any]:
    """The pack's train stage at its reference size (the project's defaults; a smoke run: one adapter
    block, batch 2) on the shards precompute wrote: eager and compiled steps/s, FLOPs per step, MFU
    against a timed matmul."""
    total = args.warmup + args.steps
    project.update_settings([f"train.steps={total}", f"train.log_every={args.log_every}",
                             f"train.val_every={total}", f"train.save_every={total}",
                             *(("train.depth=1", "train.batch_size=2") if args.smoke else ()),
                             *(("train.width=64",) if args.tiny else ())])
    device = torch.device(args.device)
    out: dict[str, Any] = {}
    modes = ["off"] + ([] if args.no_compile else ["on"])
    for mode in modes:
        project.update_settings([f"train.compile={mode}"])
        shutil.rmtree(project.checkpoints_dir, ignore_errors=True)
        rate, _ = time_stage(Project.open(project.root), args)
        out[f"train_{'compile' if mode == 'on' else 'eager'}_steps_per_s"] = round(rate, 3)
        log(f"  train compile {mode:<3} {rate:8.2f} steps/s")
    out["train_steps_per_s"] = out.get("train_compile_steps_per_s", out["train_eager_steps_per_s"])
    project.update_settings(["train.compile=off"])          # FLOPs counted on the eager step
    project = Project.open(project.root)
    trainer = Trainer(project, ListReport())
    t = project.settings.train
    stream = ShardStream(sorted(project.shards_dir("train").glob("train-*.safetensors")), t.batch_size, t.seed)
    flops = step_flops(trainer, stream.next().to(trainer.device))
    peak = peak_tflops(device)
    floor = peak * 1e12 / flops
    out.update(flops_per_step=flops, peak_tflops=round(peak, 3), floor_steps_per_s=round(floor, 2),
               mfu=round(out["train_steps_per_s"] / floor, 4),
               adapter={"width": t.width, "depth": t.depth, "batch": t.batch_size,
                        "parameters": sum(p.numel() for p in trainer.model.parameters())})
    return out


def main_real(args: argparse.Namespace) -> int:
    """Each pack in a child process of its own (a 16B teacher's memory is gone before the next one
    loads, and each pack's peak memory is its own); one JSON line with an object per pack id."""
    figures: dict[str, Any] = {"device": args.device, "size": "real", "smoke": args.smoke, "tiny": args.tiny,
                               "steps": args.steps,
                               "warmup": args.warmup, "prompts": args.prompts, "torch": torch.__version__}
    if args.device.startswith("cuda"):
        figures["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    failed = []
    for pack in args.pack:
        command = [sys.executable, __file__, "--size", "real", "--one", pack, "--device", args.device,
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--prompts", str(args.prompts)]
        command += ["--smoke"] * args.smoke + ["--tiny"] * args.tiny + ["--no-compile"] * args.no_compile
        r = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        lines = r.stdout.strip().splitlines()
        if r.returncode or not lines:
            figures[pack] = {"error": f"exit {r.returncode}"}
            failed.append(pack)
            continue
        figures[pack] = json.loads(lines[-1])
    print(json.dumps(figures))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.size == "real":
        if args.one:
            with tempfile.TemporaryDirectory(prefix="bench-gpu-real-") as tmp:
                os.environ["GGUF_TRAINER_HOME"] = str(Path(tmp) / "home")
                print(json.dumps(bench_real_pack(args.one, Path(tmp), args)))
            return 0
        return main_real(args)
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
