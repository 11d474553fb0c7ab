"""Run an exported adapter the way the engine does, and compare it with a reference dump.

For debugging a deployment: feed the adapter either the student states the engine dumped
(`SD_DUMP_COND` writes qwen_hidden.bin, t5_ids.txt and adapter_out.bin: raw little-endian
f32, one row after another) or a prompt through the pack's template and the student, then
compare the rows with the engine's adapter_out.bin or a teacher context.bin.

The Qwen3.5 bridge takes more: the Qwen3.5 ids of its MOSS template (one slot each), the raw
vision embeds of the references with the slots each reference's run starts at, and which head
to read — the slot rows MOSS-Image receives, or with `bank` the FLUX.3 Klein bank rows.
A Ming adapter takes the Ling ids of the Ming template (one slot each) and, for an input image,
its Ling vision rows (pig_ming_vision's output) with the slot its `<imagePatch>` run starts at;
it returns what the engine hands the DiT, [n_cap + P, out_dim]: the 256 caption rows zero-padded
to out_dim, then one direct row per slot (with `bank`, the caption rows alone at cap_dim).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainer_core.base.atomic import atomic_write_bytes
from trainer_core.base.errors import ModelFileError, UsageError
from trainer_core.contract.adapter import MING, AdapterConfig
from trainer_core.contract.bridge import BANK_PREFIX, BANK_SUFFIX, bank_length
from trainer_core.contract.gguf_io import AdapterFile

__all__ = ["read_rows", "read_ids", "parse_vis_pos", "ming_seed_ids", "bridge_inputs", "run_adapter", "compare_rows",
           "Comparison", "save_rows"]


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


def ming_seed_ids(path: str | os.PathLike, prompt: str, n_image: int = 0) -> tuple[list[int], int]:
    """(the Ling ids of the Ming template around `prompt`, the first <imagePatch> slot or −1), tokenized
    with the tokenizer the adapter file carries, as the engine does."""
    import gguf
    from tokenizers import Tokenizer

    from trainer_core.contract.adapter_layout import TOKENIZER_JSON
    from trainer_core.packs.ming_image.template import build_prompt_ids, encoder
    reader = gguf.GGUFReader(str(path))
    found = [t for t in reader.tensors if t.name == TOKENIZER_JSON]
    if not found:
        raise ModelFileError(f"{path} carries no {TOKENIZER_JSON}, so the Ming template cannot be tokenized from "
                             "it; pass the ids with --seed-ids or export the adapter again.")
    data = np.asarray(found[0].data, np.float32).astype(np.uint8).tobytes()
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - bad UTF-8, or the tokenizers library's own error type
        raise ModelFileError(f"the {TOKENIZER_JSON} tensor of {path} is not a tokenizer.json ({e}); export the "
                             "adapter again.") from None
    return build_prompt_ids(encoder(tokenizer), prompt, n_image)


def bridge_inputs(c: AdapterConfig, hidden: np.ndarray, seed_ids: list[int] | None, vis: np.ndarray | None,
                  vis_pos: list[tuple[int, int]] | None, bank: bool) -> dict[str, torch.Tensor]:
    """The Bridge's keyword inputs for one sample, batch 1, as the engine builds them: seed_ids [1, P];
    vis_slot [1, P, vis] (reference k's rows under slots S_k … S_k + N_k − 1, zeros elsewhere) and
    vis_kv [1, V, vis] (every row, in image order); for the FLUX.3 bank of a prompt-aligned adapter,
    bank_hidden [1, n_bank, in] with row 3 + i = student row i, zeros elsewhere."""
    ming = c.kind == MING
    if seed_ids is None:
        which = "Ling ids of the Ming template" if ming else "Qwen3.5 ids of the MOSS template"
        raise UsageError(f"This adapter seeds one slot per template token: pass the {which} with --seed-ids "
                         "(seed_ids.txt, one id a line, or a .npy).")
    P = len(seed_ids)
    if not 1 <= P <= c.max_slots:
        why = ("a longer prompt does not fit this adapter (train it with a larger train.max_slots)" if ming else
               "a longer template needs smaller references (the engine's vlm_max_size=512)")
        raise UsageError(f"--seed-ids has {P} ids but this adapter takes 1 to {c.max_slots}; {why}.")
    if min(seed_ids) < 0 or max(seed_ids) >= c.seed_vocab:
        bad = next(i for i in seed_ids if not 0 <= i < c.seed_vocab)
        raise UsageError(f"--seed-ids holds the id {bad}, outside the adapter's seed table (0..{c.seed_vocab - 1}).")
    if (vis is None) != (vis_pos is None):
        raise UsageError("--vis and --vis-pos go together: the raw vision rows of every reference, and the slot "
                         "start and count of each reference's run (S:N,…).")
    out = {"seed_ids": torch.tensor([seed_ids])}
    if ming and vis_pos is not None and len(vis_pos) > 1:
        raise UsageError(f"--vis-pos names {len(vis_pos)} runs but Ming conditions on one input image; give its "
                         "single run (START:COUNT).")
    if vis is not None and vis_pos is not None:
        if sum(n for _, n in vis_pos) != vis.shape[0]:
            raise UsageError(f"--vis-pos places {sum(n for _, n in vis_pos)} vision rows but --vis holds "
                             f"{vis.shape[0]}; the counts must add up to the rows of --vis.")
        vis_slot = np.zeros((P, vis.shape[1]), np.float32)
        row, end = 0, 0
        for k, (start, count) in enumerate(vis_pos, 1):
            if start < 0 or count < 1 or start + count > P:
                raise UsageError(f"--vis-pos run {k} ({start}:{count}) is not inside the {P} template slots of "
                                 f"--seed-ids; each run needs 0 ≤ START and START + COUNT ≤ {P}, COUNT ≥ 1.")
            if start < end:
                raise UsageError(f"--vis-pos run {k} ({start}:{count}) starts before run {k - 1} ends (slot {end}); "
                                 f"the runs come in image order and do not overlap.")
            vis_slot[start:start + count] = vis[row:row + count]
            row, end = row + count, start + count
        out.update(vis_slot=torch.from_numpy(vis_slot)[None], vis_kv=torch.from_numpy(vis)[None])
    if bank and ming:
        return out
    if bank and not c.n_bank:
        raise UsageError("--bank reads the FLUX.3 Klein bank, and this adapter has none (FLUX.3 refuses it).")
    if bank and c.bank_align:
        bank_hidden = np.zeros((c.n_bank, hidden.shape[1]), np.float32)
        body = hidden[:max(0, c.n_bank - BANK_PREFIX)]
        bank_hidden[BANK_PREFIX:BANK_PREFIX + body.shape[0]] = body
        out["bank_hidden"] = torch.from_numpy(bank_hidden)[None]
    return out


def run_adapter(adapter: AdapterFile, hidden: np.ndarray, t5_ids: list[int] | None = None,
                vis: np.ndarray | None = None, *, seed_ids: list[int] | None = None,
                vis_pos: list[tuple[int, int]] | None = None, bank: bool = False) -> np.ndarray:
    """The adapter on one sequence of student states, batch 1 and no mask, as the engine runs it.

    `vis` is dense (one row per student row) for token-aligned adapters and the raw rows of every
    reference for the bridge (placed by `vis_pos`). The bridge returns its slot rows [P, out_dim]
    (MOSS-Image; the bank runs without the student's rows), or with `bank` the Klein bank rows the
    engine hands FLUX.3: all n_bank of a caption bank, the first min(n_bank, ceil80(3 + L + 5)) of a
    prompt-aligned one (L = the student's rows, the raw prompt's tokens). Ming returns the engine's
    [pad(caption rows, out_dim) ; direct rows], or with `bank` the caption rows [n_cap, cap_dim]."""
    c = adapter.config
    h = torch.from_numpy(hidden).unsqueeze(0)                                  # [1, L, in]
    if c.bridge:
        if t5_ids is not None:
            raise UsageError(f"--t5-ids is only for seeded resamplers; this adapter ({c.kind}) takes --seed-ids.")
        kwargs = bridge_inputs(c, hidden, seed_ids, vis, vis_pos, bank)
        with torch.no_grad():
            bank_rows, slot_rows = adapter.model(h, None, **kwargs)           # [1, n_bank, bank_dim], [1, P, out]
        if c.kind == MING:
            cap = bank_rows[0].numpy()
            if bank:
                return cap
            pad = np.zeros((cap.shape[0], c.out_dim - cap.shape[1]), cap.dtype)
            return np.concatenate([np.concatenate([cap, pad], 1), slot_rows[0].numpy()])
        if not bank:
            return slot_rows[0].numpy()
        keep = bank_length(BANK_PREFIX + hidden.shape[0] + BANK_SUFFIX, c.n_bank) if c.bank_align else c.n_bank
        return bank_rows[0, :keep].numpy()
    for given, option in ((seed_ids, "--seed-ids"), (vis_pos, "--vis-pos"), (bank or None, "--bank")):
        if given is not None:
            raise UsageError(f"{option} is only for Qwen3.5 bridge and Ming adapters; this one is a {c.kind}.")
    kwargs = {}
    if c.kind == "seeded_resampler":
        if t5_ids is None:
            raise UsageError("This adapter is seeded with T5 token ids: pass them with --t5-ids "
                             "(the engine's t5_ids.txt or a .npy).")
        if len(t5_ids) != c.num_queries:
            raise UsageError(f"--t5-ids has {len(t5_ids)} ids but this adapter has {c.num_queries} query "
                             f"slots; the window is the T5 ids + EOS padded with 0 to {c.num_queries}.")
        if max(t5_ids) >= c.seed_vocab or min(t5_ids) < 0:
            raise UsageError(f"--t5-ids holds an id outside the adapter's seed table (0..{c.seed_vocab - 1}).")
        kwargs["seed_ids"] = torch.tensor([t5_ids])
    elif t5_ids is not None:
        raise UsageError(f"--t5-ids is only for seeded adapters; this one is a {c.kind}.")
    if vis is not None:
        if not c.token_aligned or not c.has_vis_in:
            raise UsageError("--vis is only for token-aligned adapters with a vision input (vis_in).")
        if vis.shape[0] != hidden.shape[0]:
            raise UsageError(f"--vis has {vis.shape[0]} rows but the student states have {hidden.shape[0]}; "
                             f"the vision rows are dense: zeros outside the image slots.")
        kwargs["vis"] = torch.from_numpy(vis).unsqueeze(0)
    with torch.no_grad():
        out = adapter.model(h, None, **kwargs)                                 # [1, R, out]
    return out[0].numpy()


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
