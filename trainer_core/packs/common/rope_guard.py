"""The rotary-table guard of remote-code teachers (LLaDA2-MoE) under transformers 5.

transformers 5 builds models on the meta device. A rotary module's `inv_freq` is a
non-persistent buffer: not in the checkpoint, and remote code written for 4.x never fills it
again, so it comes out as uninitialised memory (1e27, 0, ...). Such a teacher still emits
plausible rows with the positions scrambled, and an adapter trained on them ignores the prompt
(centred cosine ~0.87 instead of >= 0.96). So after loading, every table is checked, a bad one is
rebuilt from the module's config, and the teacher refuses to run while any table is still bad.

transformers 5 also dropped the "default" entry of ROPE_INIT_FUNCTIONS that 4.x remote code
asks for (`rope_type: default`); `default_rope()` puts one back while such a model is built, and
takes it away again: transformers' own models look the table up too when they initialise their
rotary buffers, and a global "default" would replace their own (Qwen3.5's partial multimodal
rope came out the wrong length when the LLaDA teacher had run earlier in the process).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import nn

from trainer_core.base.errors import TrainerError

__all__ = ["default_rope", "default_rope_init", "rope_modules", "table_problem", "repair_rope_tables",
           "check_rope_tables", "RopeError"]


class RopeError(TrainerError, RuntimeError):
    """A rotary table that could not be repaired: the teacher must not run (the stage reports
    the message and fails; no traceback, it is not a bug of ours)."""


def default_rope_init(config: Any, device: torch.device | None = None, *_: Any, **__: Any
                      ) -> tuple[torch.Tensor, float]:
    """inv_freq = 1 / θ^(arange(0, dim, 2) / dim), dim = head_dim × partial_rotary_factor; scaling 1."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    theta = float(getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get(
        "rope_theta", 10000.0))
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
                                / dim))
    return inv_freq, 1.0


@contextlib.contextmanager
def default_rope() -> Iterator[bool]:
    """The "default" rope type registered for the block when transformers lacks it (4.x remote code looks
    it up when its modules are built; they keep the function), removed afterwards; yields whether it was
    added."""
    from transformers import modeling_rope_utils
    table = modeling_rope_utils.ROPE_INIT_FUNCTIONS
    added = "default" not in table
    if added:
        table["default"] = default_rope_init
    try:
        yield added
    finally:
        if added and table.get("default") is default_rope_init:
            del table["default"]


def rope_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every module with a rope_init_fn, a config and an inv_freq buffer."""
    return [(name, mod) for name, mod in model.named_modules()
            if hasattr(mod, "rope_init_fn") and hasattr(mod, "config")
            and "inv_freq" in dict(mod.named_buffers(recurse=False))]


def table_problem(table: torch.Tensor | None) -> str | None:
    """Why a table is not a rotary frequency table, or None when it is sane."""
    if table is None or table.numel() == 0:
        return "missing or empty"
    if table.device.type == "meta":
        return "still on the meta device"
    f = table.detach().float().cpu()
    if not torch.isfinite(f).all():
        return "not finite"
    if abs(float(f[0]) - 1.0) > 1e-4:
        return f"first entry {float(f[0]):.6g}, not 1"
    if (f[1:] > f[:-1]).any():
        return "increasing"
    if (f <= 0).any():
        return "not positive"
    return None


def repair_rope_tables(model: nn.Module, log: Callable[[str], None] = lambda m: None) -> list[str]:
    """Rebuild every insane inv_freq from its module's config; returns the module names repaired."""
    repaired = []
    for name, mod in rope_modules(model):
        problem = table_problem(mod.inv_freq)
        if problem is None:
            continue
        device = None if mod.inv_freq.device.type == "meta" else mod.inv_freq.device
        inv_freq, scaling = mod.rope_init_fn(mod.config, device)
        if mod.inv_freq.device.type == "meta" or mod.inv_freq.shape != inv_freq.shape:
            mod.register_buffer("inv_freq", inv_freq, persistent=False)
        else:
            with torch.no_grad():
                mod.inv_freq.copy_(inv_freq.to(dtype=mod.inv_freq.dtype, device=mod.inv_freq.device))
        mod.original_inv_freq = mod.inv_freq
        mod.attention_scaling = scaling
        log(f"rotary table of {name or 'the model'} was {problem}; rebuilt from its config")
        repaired.append(name)
    return repaired


def check_rope_tables(model: nn.Module) -> None:
    """Raise RopeError naming every module whose table is still bad."""
    bad = [(name, problem) for name, mod in rope_modules(model) if (problem := table_problem(mod.inv_freq))]
    if bad:
        listing = "; ".join(f"{name or 'the model'}: {problem}" for name, problem in bad)
        raise RopeError(f"The teacher's rotary tables are broken ({listing}); its rows would scramble token "
                        f"positions, so precompute refuses to run. Update transformers or the teacher snapshot.")
