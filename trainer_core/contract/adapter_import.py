"""Adapter GGUF → the train stage's starting weights: the inverse of adapter_export.

Any file the engine runs is a start (ours, another trainer's, one from the Hub): `read_adapter_gguf`
rebuilds the network the engine reads from the tensors alone, refusing what `inspect` calls fatal.
What the exporter did to the weights is undone here:

* dtypes: the file's F16/F32 values become f32 parameters as they are (a re-export writes the same
  F16 bytes back: f16 → f32 → f16 is exact);
* the standardization fold (a kind trained on (t − μ)/σ: W' = diag(σ)·W, b' = σ ⊙ b + μ on out_proj,
  σ alone on a skip path, the bank head's own μ, σ): unfolded with *this project's* statistics,
  W = W'/σ, b = (b' − μ)/σ, so the adapter computes at step 0 exactly the rows the file computes.
  The fold is f32 arithmetic rounded to the file's dtype, so it has no exact inverse: of the f32
  values whose fold gives the file's value, the one nearest the real quotient is taken (the
  quotient's f32 rounding, else its neighbours within two units in the last place); where none
  exists (a folded f32 bias element whose neighbours all refold one unit away) the nearest is
  kept, and `Unfold.inexact` counts them;
* nothing else is folded or transposed: ne is the reversed torch shape and a seed table is
  stored whole (a factorized seed is refused by the layout check, as the engine's reader of ours).

Parts the trainer keeps frozen (a vision projection, a fitted seed table) are taken from the file
too: the start is the file's network, whole.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import torch

    from trainer_core.contract.kinds import AdapterConfig

__all__ = ["Unfold", "config_difference", "mismatch_sentence", "read_start", "unfold_standardization", "load_start"]


@dataclass
class Unfold:
    state: dict[str, "torch.Tensor"]      # f32, the state_dict the train stage loads
    inexact: int                          # folded values whose re-fold is one unit off the file's


def config_difference(found: "AdapterConfig", expected: "AdapterConfig") -> tuple[str, Any, Any] | None:
    """The first field (kind first, then the common fields, then the kind's own) in which two adapters
    differ, as (field, found, expected); None when they are the same network."""
    if found.kind != expected.kind:
        return "kind", found.kind, expected.kind
    a, b = found.to_dict(), expected.to_dict()
    for key in a:
        if a[key] != b.get(key):
            return key, a[key], b.get(key)
    return None


def read_start(path: str | os.PathLike) -> tuple["AdapterConfig", dict[str, "torch.Tensor"], list[str]]:
    """(config, the file's tensors as f32 in state_dict order, the non-fatal layout notes); raises
    ModelFileError (a sentence) for a file the engine would refuse or misread."""
    from trainer_core.contract.gguf_io import read_adapter_gguf
    adapter = read_adapter_gguf(path)
    state = {k: v.detach().float().clone() for k, v in adapter.model.state_dict().items()}
    return adapter.config, state, [p.message for p in adapter.problems]


def unfold_standardization(folded: Mapping[str, "torch.Tensor"], config: "AdapterConfig", mu: "torch.Tensor",
                           sigma: "torch.Tensor", bank_mu: "torch.Tensor | None" = None,
                           bank_sigma: "torch.Tensor | None" = None) -> Unfold:
    """The standardized-space state whose `fold_standardization` (with these statistics) is `folded`, value
    for value in the dtypes the exporter writes wherever such a value exists (module docstring)."""
    import torch

    from trainer_core.contract.gguf_io import fold_standardization, gguf_dtype
    state = {k: v.detach().to(torch.float32).clone() for k, v in folded.items()}
    if not config.spec.standardized:
        return Unfold(state, 0)
    bank_head = config.spec.bank_head(config)
    if bank_head is not None and f"{bank_head}.weight" not in state:
        bank_head = None
    heads: list[tuple[str, Any, Any]] = [("out_proj", mu, sigma)]
    if "skip.weight" in state:
        heads.append(("skip", None, sigma))
    if bank_head is not None:
        if bank_mu is None or bank_sigma is None:
            raise ValueError(f"unfold: {bank_head} needs the bank statistics")
        heads.append((bank_head, bank_mu, bank_sigma))
    else:
        bank_mu = bank_sigma = None
    quotient: dict[str, torch.Tensor] = {}
    for head, m, s in heads:
        s64 = s.to(torch.float64).reshape(-1)
        w, b = state[f"{head}.weight"].double(), state[f"{head}.bias"].double()
        quotient[f"{head}.weight"] = (w / s64[:, None]).float()
        shifted = b - m.to(torch.float64).reshape(-1) if m is not None else b
        quotient[f"{head}.bias"] = (shifted / s64).float()

    def stored(name: str, t: torch.Tensor) -> torch.Tensor:
        dtype = torch.float32 if gguf_dtype(name, t.ndim) == "f32" else torch.float16
        return t.to(dtype).float()

    target = {n: stored(n, state[n]) for n in quotient}
    best = {n: q.clone() for n, q in quotient.items()}
    refold = fold_standardization({**state, **best}, mu, sigma, bank_mu, bank_sigma, bank_head)
    ok = {n: stored(n, refold[n]) == target[n] for n in quotient}
    for step in (1, -1, 2, -2):
        if all(bool(v.all()) for v in ok.values()):
            break
        trial = {n: _ulps(q, step) for n, q in quotient.items()}
        refold = fold_standardization({**state, **trial}, mu, sigma, bank_mu, bank_sigma, bank_head)
        for n in quotient:
            good = (stored(n, refold[n]) == target[n]) & ~ok[n]
            best[n] = torch.where(good, trial[n], best[n])
            ok[n] |= good
    state.update(best)
    return Unfold(state, sum(int((~v).sum()) for v in ok.values()))


def _ulps(t: "torch.Tensor", n: int) -> "torch.Tensor":
    import torch
    toward = torch.full_like(t, float("inf") if n > 0 else float("-inf"))
    for _ in range(abs(n)):
        t = torch.nextafter(t, toward)
    return t


def mismatch_sentence(source: str, found: "AdapterConfig", expected: "AdapterConfig") -> str | None:
    """One sentence naming the first field in which the file's adapter differs from the project's; None if
    it does not."""
    diff = config_difference(found, expected)
    if diff is None:
        return None
    field, a, b = diff
    return (f"the adapter {source} has {field} {a}, but this project's adapter needs {field} {b}; start from an "
            f"adapter of this pack's shapes (`gguf-trainer inspect` shows a file's).")


def load_start(project: Any, model: "torch.nn.Module", config: "AdapterConfig", mu: "torch.Tensor",
               sigma: "torch.Tensor", bank_stats: tuple["torch.Tensor", "torch.Tensor"] | None) -> str | None:
    """Load the project's start adapter (checkpoints.start_path), unfolded with the project's statistics, into
    `model`; returns the sentence to log, None when the project has no start file. A file that no longer fits
    the project's adapter (its settings changed since) is a UsageError naming the field."""
    from trainer_core.base.errors import UsageError
    from trainer_core.contract import checkpoints
    path = checkpoints.start_path(project)
    if not path.is_file():
        return None
    record = checkpoints.read_start_record(project) or {}
    source = str(record.get("source") or path)
    found, state, _ = read_start(path)
    why = mismatch_sentence(source, found, config)
    if why is not None:
        raise UsageError(f"{why[0].upper()}{why[1:-1]} (delete {path.parent} to train from scratch).")
    bank = tuple(t.cpu() for t in bank_stats) if bank_stats is not None else (None, None)
    unfolded = unfold_standardization(state, config, mu.cpu(), sigma.cpu(), *bank)
    model.load_state_dict(unfolded.state)
    inexact = (f"; {unfolded.inexact} folded values re-export one unit in the last place off the file's"
               if unfolded.inexact else "")
    return f"started from the adapter {source} at step 0 with a fresh optimizer{inexact}"
