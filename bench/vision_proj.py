"""vision_proj fit: time and peak memory, streaming against what holding both tables costs.

    PYTHONPATH=. python bench/vision_proj.py [--vocab 151936] [--vis 2560] [--in-dim 1024] [--block 8192]

A synthetic teacher table [vocab, vis] (bf16, written to a temporary safetensors file and read
back through its memory map, as from a real snapshot) and a student table [vocab, in] (bf16 in
memory, as the loaded student holds it) are fitted with `fit_vision_proj` in a fresh child
process. The child reports its wall time and the growth of its peak RSS over the baseline
after the tables exist (VmHWM reset through /proc/self/clear_refs, then compared with VmRSS);
the teacher file's pages count, as they do for a real snapshot. `dense_f64_gib` is what the published package's approach needs
for the two tables alone in float64 (it measured 10–13 GB of RAM in practice). The default sizes
are the real ones (Qwen3-VL-4B's 151936 × 2560 against pig_clip's 151936 × 1024); the tiny
demo's are `--vocab 151936 --vis 64 --in-dim 64`.

Ends with one JSON line: fit_s, peak_extra_gib, dense_f64_gib, fit_cos_mean, shapes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def vm_gib(field: str) -> float:
    """VmHWM (peak RSS) or VmRSS of this process in GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 2**30
    return float("nan")


def reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def child(args: argparse.Namespace) -> None:
    import torch
    from safetensors.torch import save_file

    from trainer_core.packs.common.qwen3vl.vision_proj import fit_vision_proj, safetensors_rows, tensor_rows
    g = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        teacher = torch.randn(args.vocab, args.vis, generator=g, dtype=torch.float32).bfloat16()
        save_file({"model.language_model.embed_tokens.weight": teacher}, str(Path(tmp) / "model.safetensors"))
        mix = torch.randn(args.in_dim, args.vis, generator=g) / args.vis ** 0.5
        student = torch.empty(args.vocab, args.in_dim, dtype=torch.bfloat16)
        for a in range(0, args.vocab, 16384):
            student[a:a + 16384] = (teacher[a:a + 16384].float() @ mix.T).bfloat16()
        del teacher
        # the baseline: the student table in memory, the teacher file on disk, nothing fitted yet
        reset_peak()
        base = vm_gib("VmRSS")
        start = time.perf_counter()
        fit = fit_vision_proj(safetensors_rows(tmp), tensor_rows(student), block=args.block)
        seconds = time.perf_counter() - start
        print(json.dumps({"fit_s": round(seconds, 2), "peak_extra_gib": round(vm_gib("VmHWM") - base, 3),
                          "fit_cos_mean": round(fit.fit_cos_mean, 6)}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--vis", type=int, default=2560)
    parser.add_argument("--in-dim", type=int, default=1024)
    parser.add_argument("--block", type=int, default=8192)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    argv = [sys.executable, __file__, "--child", "--vocab", str(args.vocab), "--vis", str(args.vis),
            "--in-dim", str(args.in_dim), "--block", str(args.block)]
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ}, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result.update(dense_f64_gib=round(args.vocab * (args.vis + args.in_dim) * 8 / 2**30, 3),
                  shapes={"vocab": args.vocab, "vis": args.vis, "in_dim": args.in_dim, "block": args.block})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
