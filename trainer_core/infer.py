"""Run an exported adapter the way the engine does, and compare it with a reference dump.

For debugging a deployment: feed the adapter either the student states the engine dumped
(`SD_DUMP_COND` writes qwen_hidden.bin, t5_ids.txt and adapter_out.bin: raw little-endian
f32, one row after another) or a prompt through the pack's template and the student, then
compare the rows with the engine's adapter_out.bin or a teacher context.bin.

What an adapter takes beyond the student states, and what it returns, is its kind's
(contract/kinds/: `infer_options` and `infer`): T5 ids for a seeded resampler, dense vision rows
for a token-aligned adapter, template ids, reference runs and a head for the bridges. An option
the kind does not take is refused, naming the kinds that do.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer_core.base.atomic import atomic_write_bytes
from trainer_core.base.errors import ModelFileError, UsageError
from trainer_core.contract.gguf_io import AdapterFile
from trainer_core.contract.kinds import registered

__all__ = ["read_rows", "read_ids", "parse_vis_pos", "takers", "run_adapter", "compare_rows", "Comparison",
           "save_rows"]


def read_rows(path: str | os.PathLike, width: int, what: str) -> np.ndarray:
    """[rows, width] float32 from a .npy file or a raw little-endian f32 dump."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".npy":
            array = np.load(path, allow_pickle=False).astype(np.float32)
            if array.ndim == 3 and array.shape[0] == 1:
                array = array[0]
        else:
            raw = path.read_bytes()
            if len(raw) % (4 * width):
                raise ModelFileError(
                    f"{path} ({what}) holds {len(raw)} bytes, which is not a whole number of f32 rows "
                    f"of width {width}; pass the dump that belongs to this adapter.")
            array = np.frombuffer(raw, dtype="<f4").reshape(-1, width).copy()
    except FileNotFoundError:
        raise ModelFileError(f"{path} ({what}) does not exist; check the path.") from None
    except ValueError as e:
        raise ModelFileError(f"{path} ({what}) is not a readable .npy array ({e}).") from None
    if array.ndim != 2 or array.shape[1] != width:
        raise ModelFileError(f"{path} ({what}) has shape {list(array.shape)}; rows of width {width} "
                             f"are needed for this adapter.")
    if not np.isfinite(array).all():
        raise ModelFileError(f"{path} ({what}) contains NaN or infinite values.")
    return array


def read_ids(path: str | os.PathLike, option: str = "--t5-ids") -> list[int]:
    """Token ids from a .npy array or a text file with one id a line (the engine's t5_ids.txt,
    seed_ids.txt); `option` names the command-line option in the messages."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".npy":
            return [int(x) for x in np.load(path, allow_pickle=False).reshape(-1)]
        lines = path.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        raise ModelFileError(f"{path} ({option}) does not exist; check the path.") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelFileError(f"{path} ({option}) is not a list of token ids ({e}).") from None
    try:
        return [int(x) for x in lines]
    except ValueError:
        bad = next(x for x in lines if not x.lstrip("-").isdigit())
        raise ModelFileError(f'{path} ({option}) holds "{bad}", which is not a token id; one id a line.') from None


def parse_vis_pos(text: str) -> list[tuple[int, int]]:
    """"S:N[,S:N…]" → [(first slot, slot count)] of each reference's run, in image order."""
    runs = []
    for item in text.split(","):
        start, sep, count = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            runs.append((int(start), int(count)))
        except ValueError:
            raise UsageError(f'--vis-pos "{item.strip()}" is not START:COUNT; give each reference\'s first slot '
                             f'and slot count, comma-separated (e.g. 4:192,200:256).') from None
    return runs


def takers(option: str) -> str:
    """The kinds whose adapters take an infer option, as a message names them ("Qwen3.5 bridge and Ming
    adapters")."""
    plurals = [k.plural for k in registered().values() if option in k.infer_options]
    suffix = " adapters"
    if len(plurals) > 1 and all(p.endswith(suffix) for p in plurals):
        plurals = [p[:-len(suffix)] for p in plurals[:-1]] + [plurals[-1]]
    if len(plurals) < 2:
        return plurals[0] if plurals else "no adapter kind"
    return ", ".join(plurals[:-1]) + " and " + plurals[-1]


def run_adapter(adapter: AdapterFile, hidden: np.ndarray, t5_ids: list[int] | None = None,
                vis: np.ndarray | None = None, *, seed_ids: list[int] | None = None,
                vis_pos: list[tuple[int, int]] | None = None, bank: bool = False,
                empty_prompt: bool = False) -> np.ndarray:
    """The adapter on one sequence of student states, batch 1 and no mask, as the engine runs it (its
    kind's `infer`), after refusing the inputs its kind does not take; `empty_prompt`: the states are the
    empty prompt's (the engine's FLUX.3 bank then takes none of them)."""
    c = adapter.config
    given = {"--t5-ids": t5_ids, "--vis": vis, "--seed-ids": seed_ids, "--vis-pos": vis_pos, "--bank": bank or None}
    given = {option: value for option, value in given.items() if value is not None}
    for option in given:
        if option not in c.spec.infer_options:
            raise UsageError(f"{option} is only for {takers(option)}; this one is a {c.kind}.")
    return c.spec.infer(c, adapter.model, hidden, {**given, "empty_prompt": empty_prompt})


@dataclass
class Comparison:
    rows: int
    first_row: int      # the adapter rows compared start here (the engine's slice, when the reference has fewer)
    cos: float          # mean over rows of the plain cosine
    cos_centered: float  # rows centred on the reference's per-dimension mean first
    rel_mse: float      # Σ(p − r)² / Σ r²


def compare_rows(pred: np.ndarray, ref: np.ndarray) -> Comparison:
    """Compare adapter rows with reference rows; when the reference is shorter, its rows are the
    adapter's last ones (the engine drops the leading template rows before the DiT)."""
    if ref.shape[0] > pred.shape[0]:
        raise UsageError(f"the reference has {ref.shape[0]} rows but the adapter produced {pred.shape[0]}; "
                         f"it is not a dump of this prompt.")
    start = pred.shape[0] - ref.shape[0]
    p, r = pred[start:].astype(np.float64), ref.astype(np.float64)

    def mean_cos(a: np.ndarray, b: np.ndarray) -> float:
        num = (a * b).sum(-1)
        den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
        return float(np.mean(num / np.maximum(den, 1e-12)))

    mu = r.mean(0, keepdims=True)
    return Comparison(rows=r.shape[0], first_row=start, cos=mean_cos(p, r),
                      cos_centered=mean_cos(p - mu, r - mu),
                      rel_mse=float(((p - r) ** 2).sum() / max((r ** 2).sum(), 1e-30)))


def save_rows(path: str | os.PathLike, rows: np.ndarray) -> None:
    """.npy, or a raw little-endian f32 dump like the engine's for any other suffix."""
    path = Path(path)
    if path.suffix.lower() == ".npy":
        import io
        buf = io.BytesIO()
        np.save(buf, rows.astype(np.float32), allow_pickle=False)
        atomic_write_bytes(path, buf.getvalue())
    else:
        atomic_write_bytes(path, rows.astype("<f4").tobytes())
