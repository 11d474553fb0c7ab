"""train.grad_checkpoint: the memory activation checkpointing saves, and what it costs, per adapter kind.

    PYTHONPATH=. python bench/grad_checkpoint.py [--steps N] [--batch B] [--device cpu|cuda]

Each kind at its reference width and depth (LLaDA's resampler: width 1024, depth 6, 256 queries;
FLUX.3's layerwise: depth 4, 8 × 2560 out; the Qwen3.5 bridge: depth 6, a 240-row bank + 300 slots)
runs a few optimizer steps on random batches with checkpointing off and on, each in a fresh child
process; the child reports the peak memory of the steps alone (CPU: VmHWM after a reset, minus the
RSS before; CUDA: torch's peak allocated) and the seconds per step. Both runs start from the same
init and batches, so they must end on the same weights (`same`). The last stdout line is JSON:
{kind: {"peak_mib_off", "peak_mib_on", "saved", "step_s_off", "step_s_on", "slowdown", "same"}}.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from trainer_core.contract.kinds import AdapterConfig, build_adapter

KINDS = {c["kind"]: c for c in (
    dict(kind="resampler", in_dim=1024, out_dim=2048, width=1024, depth=6, num_queries=256),
    dict(kind="token_aligned_layerwise", in_dim=1024, out_dim=8 * 2560, width=1024, depth=4,
         taps=(4, 8, 12, 16, 20, 24, 28, 32)),
    dict(kind="qwen35_bridge", in_dim=1024, out_dim=4096, width=1024, depth=6, seed_vocab=4096, seed_rank=384,
         vis_dim=4096, max_slots=2304, n_bank=240, bank_dim=8 * 2560, bank_align=True),
)}
_L, _SLOTS = 64, 300          # student rows; the bridge's template slots (a text prompt + a 256-token reference)


def inputs(config: AdapterConfig, batch: int, device: torch.device) -> tuple[tuple, dict, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(batch, _L, config.in_dim, generator=g).to(device)
    if config.n_bank:                        # a slot kind with a bank: seed ids, vision keys and the bank's rows
        kw = {"seed_ids": torch.randint(0, config.seed_vocab, (batch, _SLOTS), generator=g).to(device),
              "vis_kv": torch.randn(batch, 256, config.vis_dim, generator=g).to(device),
              "bank_hidden": torch.randn(batch, config.n_bank, config.in_dim, generator=g).to(device)}
        targets = [torch.randn(batch, config.n_bank, config.bank_dim, generator=g).to(device),
                   torch.randn(batch, _SLOTS, config.out_dim, generator=g).to(device)]
        return (h,), kw, targets
    rows = config.spec.step_rows(config) or _L          # a resampler's queries, else one row per student row
    return (h,), {}, [torch.randn(batch, rows, config.out_dim, generator=g).to(device)]


def child(kind: str, on: bool, steps: int, batch: int, device_name: str) -> dict:
    device = torch.device(device_name)
    torch.manual_seed(0)
    config = AdapterConfig(**KINDS[kind])
    model = build_adapter(config).to(device).train()
    model.checkpointing = on
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    args, kw, targets = inputs(config, batch, device)
    status = Path("/proc/self/status")
    rss = lambda f: int(next(l for l in status.read_text().splitlines() if l.startswith(f)).split()[1]) / 1024  # noqa
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) / 2**20
    else:
        Path("/proc/self/clear_refs").write_text("5")
        base = rss("VmRSS:")
    started = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        out = model(*args, **kw)
        outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
        loss = sum(((o.float() - t) ** 2).mean() for o, t in zip(outs, targets))
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) / 2**20 - base
    else:
        peak = rss("VmHWM:") - base
    digest = hashlib.sha1(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    return {"peak_mib": round(peak, 1), "step_s": round((time.perf_counter() - started) / steps, 3), "weights": digest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1] == "on", args.steps, args.batch, args.device)))
        return 0
    results = {}
    for kind in KINDS:
        runs = {}
        for flag in ("off", "on"):
            done = subprocess.run([sys.executable, __file__, "--child", kind, flag, "--steps", str(args.steps),
                                   "--batch", str(args.batch), "--device", args.device],
                                  capture_output=True, text=True, check=True)
            runs[flag] = json.loads(done.stdout.strip().splitlines()[-1])
        off, on = runs["off"], runs["on"]
        results[kind] = {"peak_mib_off": off["peak_mib"], "peak_mib_on": on["peak_mib"],
                         "saved": round(1 - on["peak_mib"] / max(off["peak_mib"], 1e-9), 3),
                         "step_s_off": off["step_s"], "step_s_on": on["step_s"],
                         "slowdown": round(on["step_s"] / max(off["step_s"], 1e-9), 3),
                         "same": off["weights"] == on["weights"]}
        print(f"{kind}: {results[kind]}", file=sys.stderr, flush=True)
    print(json.dumps({"device": args.device, "batch": args.batch, "steps": args.steps, **results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
