"""The fingerprints of a demo run's exports: the adapter GGUF, the pack's extra outputs and eval.json without its
clock fields (`time`, `seconds`) and the paths it names. tests/test_demo_hashes.py holds the shared demo runs to
the recorded ones (tests/data/demo_hashes.json), which bench/demo_hashes.py records with these same functions."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

__all__ = ["VOLATILE", "RECORDED", "BY_MACHINE", "sha256", "eval_fingerprint", "fingerprint", "float_probe", "machine",
           "recorded_for"]

VOLATILE = ("time", "seconds", "gguf")
DATA = Path(__file__).parent / "data"
RECORDED = DATA / "demo_hashes.json"              # the first recording: capability and torch, no float probe
BY_MACHINE = DATA / "demo_hashes_machines.json"   # the float probes that reproduce it; other machines' records


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def eval_fingerprint(path: Path) -> str:
    """sha256 of eval.json without the fields that name the clock or the folder it ran in."""
    record = json.loads(path.read_text())
    for key in VOLATILE:
        record.pop(key, None)
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def fingerprint(project_dir: Path) -> dict:
    """{"gguf", "extras": {name: sha256}, "eval"} of the project's exports."""
    from trainer_core.project import Project
    project = Project.open(project_dir)
    return {"gguf": sha256(project.gguf_path()),
            "extras": {p.name: sha256(p) for p in project.pack.extras.outputs(project)},
            "eval": eval_fingerprint(project.eval_json)}


def float_probe() -> str:
    """sha256 of the float32 results of the kernels a demo run leans on (matrix products of odd shapes, attention,
    norms, activations, rotary sines, reductions, an AdamW step, a convolution, bfloat16 products), on fixed inputs.
    Two machines with the same CPU capability and torch build can still round differently (the kernel a BLAS picks
    depends on the CPU model); where this differs, so may every demo export."""
    import torch
    out: list[torch.Tensor] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                  # a machine's figure, whatever the worker's thread count
    try:
        _probe(out)
    finally:
        torch.set_num_threads(threads)
    digest = hashlib.sha256()
    for t in out:
        digest.update(t.contiguous().float().numpy().tobytes())
    return digest.hexdigest()


def _probe(out: list) -> None:
    import torch
    import torch.nn.functional as F
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(1234)
        a, b = torch.randn(37, 129), torch.randn(129, 61)
        out += [a @ b, torch.randn(3, 17, 64) @ torch.randn(3, 64, 96), F.linear(torch.randn(9, 896), torch.randn(64, 896))]
        q, k, v = (torch.randn(2, 4, 23, 16) for _ in range(3))
        out += [F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)]
        x = torch.randn(23, 96)
        out += [F.layer_norm(x, (96,)), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), F.softmax(x, -1),
                F.silu(x), F.gelu(x), F.gelu(x, approximate="tanh"), torch.exp(x), torch.tanh(x), torch.log1p(x.abs()),
                torch.sin(x * 100), torch.cos(x * 100), x.sum(0), x.cumsum(1), F.normalize(x, dim=-1)]
        out += [F.conv2d(torch.randn(1, 3, 28, 28), torch.randn(8, 3, 14, 14), stride=14)]
        out += [(torch.randn(19, 80).bfloat16() @ torch.randn(80, 33).bfloat16()).float()]
    w = torch.nn.Parameter(torch.randn(64, 48, generator=torch.Generator().manual_seed(3)))
    opt = torch.optim.AdamW([w], lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        (torch.tanh(torch.randn(16, 64, generator=torch.Generator().manual_seed(7)) @ w) ** 2).mean().backward()
        opt.step()
    out.append(w.detach())


def machine() -> dict:
    """What the recorded exports depend on: the CPU's vector capability, the torch build and the float probe."""
    import torch
    return {"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "float_probe": float_probe()}


def recorded_for(this: dict) -> dict | None:
    """The recorded fingerprints that apply on the machine `this` (machine()), or None where none do: a record of
    bench/demo_hashes.py --write made on a machine of the same capability, torch and float probe; else the first
    recording (tests/data/demo_hashes.json, made before the probe existed) where capability and torch match and
    the probe is one of the machines seen to reproduce every figure in it. The CI machine of 2026-12-06 had the
    same capability and torch and exported other bytes from the same commit: those two alone do not tell."""
    known = json.loads(BY_MACHINE.read_text())
    for record in known["records"]:
        if record["machine"] == this:
            return record
    first = json.loads(RECORDED.read_text())
    if (first["capability"], first["torch"]) == (this["capability"], this["torch"]) and \
            this["float_probe"] in known["demo_hashes.json"]["float_probes"]:
        return first
    return None
