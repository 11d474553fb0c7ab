"""The MageFlow teacher: Qwen3-VL-4B-Instruct as ggk runs it (packs-contract §B.2).

* **Vision.** A preprocessed reference image (vision_data.preprocess) is cut into Qwen2-VL
  patches and run through the vision tower; the rows are the merger's main output
  (`pooler_output`, one per 32×32 cell). Deepstack is dropped: ggk ignores it.
* **Text.** The teacher's own token embeddings, with each image's rows spliced into its
  <|image_pad|> run; right padding, a 2-D mask, causal; `position_ids=None`, which transformers
  expands to an arange over every M-RoPE section — ggk's all-equal M-RoPE, i.e. plain 1-D
  rope. The target is the final-norm `last_hidden_state`, one row per real token.
* **Placement** (`precompute.teacher_mode`): `gpu` keeps the model on the card; `offload` keeps
  the text stack's bf16 weights in RAM and computes every layer on the card (accelerate's
  cpu_offload; the embedding table stays a plain copy on the card); `auto` picks `gpu` when the
  budget holds the text stack + 3 GiB; without CUDA everything runs on the CPU.
* Native transformers models compute their rotary tables, so a bad one is not repaired here:
  the teacher refuses to run (RopeError) naming the module.

`MockVisionTeacher` gives deterministic rows of the same shapes from the image pixels and the
token ids, with no file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from trainer_core.contract.batching import pad_batch
from trainer_core.contract.devices import is_big_card, place_teacher
from trainer_core.base.errors import ModelFileError
from trainer_core.packs.common.qwen3vl.vision_data import FACTOR, MERGE, PATCH, TEMPORAL, merged_tokens, patchify
from trainer_core.packs.common.mock_teachers import seeded_normal
from trainer_core.packs.common.rope_guard import RopeError, table_problem
from trainer_core.packs.common.snapshot_teacher import SnapshotTeacher

__all__ = ["VISION_BUDGETS", "auto_budgets", "text_weights_gib", "resolve_mode", "resident_need_gib", "choose_mode",
           "RESIDENT_HEADROOM_GIB", "Qwen3VLTeacher",
           "MockVisionTeacher", "image_batches", "PAD_ID", "VisionOut", "mrope_positions", "Qwen3VLFullTeacher",
           "load_snapshot", "check_rope"]

PAD_ID = 151643                     # <|endoftext|>: right padding of the teacher's batches
RESIDENT_HEADROOM_GIB = 3.0
# §A.5 (big card / small card), scaled by the pack's budget_scale
VISION_BUDGETS = {"teacher_batch": (512, 128), "tok_budget": (65536, 12288), "student_batch": (256, 64),
                  "student_tok_budget": (131072, 24576), "vis_tok_budget": (8192, 1024)}


def auto_budgets(device: torch.device, scale: float = 1.0) -> dict[str, int]:
    """The budget of each setting left at 0, for this card (≥ 1)."""
    column = 0 if is_big_card(device) else 1
    return {k: max(1, int(v[column] * scale)) for k, v in VISION_BUDGETS.items()}


def text_weights_gib(root: str | os.PathLike) -> float:
    """Bytes of the text stack (every tensor not under model.visual.) from the safetensors headers."""
    total = 0
    for path in sorted(Path(root).glob("*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(info["data_offsets"][1] - info["data_offsets"][0] for name, info in header.items()
                     if name != "__metadata__" and not name.startswith("model.visual."))
    return total / 2**30


def resolve_mode(mode: str, device: torch.device, gpu_mem_gib: float, text_gib: float) -> str:
    """contract/placement.py's rule with `text_gib` of weights on the card plus 3 GiB of headroom."""
    return place_teacher(mode, device, gpu_mem_gib, text_gib + RESIDENT_HEADROOM_GIB)


def resident_need_gib(root: str | os.PathLike) -> float:
    """What a resident Qwen3-VL teacher needs on the card (TrainerPack.teacher_need_gib): its text stack + 3 GiB."""
    return text_weights_gib(root) + RESIDENT_HEADROOM_GIB


def choose_mode(root: str | os.PathLike, mode: str, device: torch.device, gpu_mem_gib: float) -> str:
    """The placement a Qwen3-VL teacher takes for the snapshot at `root` (the plan asks the same rule)."""
    return resolve_mode(mode, device, gpu_mem_gib, text_weights_gib(root))


def image_batches(tokens: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive images whose merged tokens stay within `budget` (always at least one)."""
    batches: list[list[int]] = []
    current, used = [], 0
    for i, n in enumerate(tokens):
        if current and used + n > budget:
            batches.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        batches.append(current)
    return batches


Spliced = Sequence[tuple[int, torch.Tensor]]      # (first slot, rows [n, dim]) per image of a sample


def load_snapshot(root: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """(the snapshot's tokenizer, transformers' Qwen3-VL model in `dtype`), or ModelFileError saying which."""
    from tokenizers import Tokenizer
    from transformers import AutoModel
    try:
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 — the tokenizers library raises plain Exception subclasses
        raise ModelFileError(f"The teacher tokenizer {root / 'tokenizer.json'} cannot be loaded ({e}); "
                             "download Qwen/Qwen3-VL-4B-Instruct again.") from None
    try:
        model = AutoModel.from_pretrained(root, dtype=dtype)
    except (OSError, ValueError, KeyError) as e:
        raise ModelFileError(f"The Qwen3-VL teacher in {root} cannot be loaded ({type(e).__name__}: {e}); "
                             "download Qwen/Qwen3-VL-4B-Instruct again.") from None
    return tokenizer, model


def check_rope(model: torch.nn.Module) -> None:
    """Refuse a model whose rotary tables are broken (RopeError naming the modules)."""
    bad = [(name, problem) for name, mod in model.named_modules()
           if isinstance(getattr(mod, "inv_freq", None), torch.Tensor) and (problem := table_problem(mod.inv_freq))]
    if bad:
        raise RopeError(f"The teacher's rotary tables are broken ({'; '.join(f'{n}: {p}' for n, p in bad)}); "
                        "precompute refuses to run. Update transformers.")


class Qwen3VLTeacher(SnapshotTeacher):
    """The real teacher from a Qwen3-VL snapshot folder (see the module docstring)."""

    placement = staticmethod(choose_mode)

    def _read(self) -> None:
        vision, text = self._config("Qwen3-VL", "the teacher", lambda c: (c.vision_config, c.text_config))
        geometry = (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
        if geometry != (PATCH, MERGE, TEMPORAL):
            raise ModelFileError(f"The teacher's vision tower uses patch {geometry[0]}, merge {geometry[1]} and "
                                 f"temporal {geometry[2]}; the engine's MageFlow path needs 16, 2 and 2.")
        self.vis_dim, self.out_dim = int(vision.out_hidden_size), int(text.hidden_size)

    def _load(self) -> None:
        self.tokenizer, model = load_snapshot(self.root, self.dtype)
        if not hasattr(model, "visual") or not hasattr(model, "language_model"):
            raise ModelFileError(f"{self.root} does not load as a Qwen3-VL model (no vision tower and text stack); "
                                 "download Qwen/Qwen3-VL-4B-Instruct again.")
        model.eval().requires_grad_(False)
        check_rope(model)
        table = model.language_model.get_input_embeddings().weight
        if self.mode == "offload":             # the table stays a plain copy on the card
            self.embed = table.detach().to(self.device, copy=True)
        self._settle(model, resident=(model.visual,), streamed=(model.language_model,))
        if self.mode != "offload":
            self.embed = table.detach()
        self.model = model

    def _summary(self) -> str:
        return f"Qwen3-VL teacher: text {self.out_dim}-d, vision rows {self.vis_dim}-d, {self.mode} on {self.device}"

    def _tower(self, images: Sequence[np.ndarray], budget: int) -> Iterator[tuple[Any, tuple, list[int]]]:
        """The vision tower over images batched within `budget` merged tokens: per batch, its output,
        the images' (1, gh, gw) patch grids and their merged token counts."""
        tokens = [merged_tokens(im) for im in images]
        for batch in image_batches(tokens, budget):
            rows, grids = zip(*(patchify(images[i]) for i in batch))
            pixels = torch.from_numpy(np.concatenate(rows)).to(self.exec_device, self.dtype)
            with torch.inference_mode():
                out = self.model.visual(hidden_states=pixels, grid_thw=torch.tensor(grids, device=self.exec_device))
            yield out, grids, [tokens[i] for i in batch]

    def encode_images(self, images: Sequence[np.ndarray], budget: int) -> list[torch.Tensor]:
        """Per preprocessed image [h, w, 3], its merger rows [(h/32)·(w/32), vis_dim] bf16 on the CPU."""
        return [rows.to("cpu", torch.bfloat16) for out, _, sizes in self._tower(images, budget)
                for rows in out.pooler_output.split(sizes)]

    def hidden(self, token_lists: Sequence[Sequence[int]], vision: Sequence[Spliced]) -> list[torch.Tensor]:
        """Per sample, the final-norm rows [len, out_dim] float32 on the CPU, its images' rows spliced at
        their slots; one padded batch."""
        ids, mask = pad_batch(token_lists, PAD_ID)
        dev = self.exec_device
        with torch.inference_mode():
            x = self.embed.to(dev)[ids.to(dev)].to(self.dtype)                          # [B, L, H]
            for b, images in enumerate(vision):
                for start, rows in images:
                    x[b, start:start + rows.shape[0]] = rows.to(dev, self.dtype)
            out = self.model.language_model(inputs_embeds=x, attention_mask=mask.long().to(dev),
                                            position_ids=None).last_hidden_state         # [B, L, out]
        return [out[b, :len(t)].to("cpu", torch.float32) for b, t in enumerate(token_lists)]

    def embed_table(self) -> torch.Tensor:
        return self.embed


class MockVisionTeacher:
    """Deterministic rows of the teacher's shapes (packs-contract §B.2.3), with no file.

    Images: each 32×32 cell's mean colour, its square and 42 sines of the cell index make 48
    features, times a fixed basis: [cells, vis_dim] bf16. Text: one-hot(id mod 64) with
    position/100 added to column 0, times a basis, plus each image's rows mixed into its slots."""

    mode = "mock"

    def __init__(self, out_dim: int, vis_dim: int):
        self.out_dim, self.vis_dim = int(out_dim), int(vis_dim)
        pix, tok, mix = seeded_normal((48, self.vis_dim), (64, self.out_dim), (self.vis_dim, self.out_dim))
        self.pix_basis, self.tok_basis, self.vis_mix = pix / 4, tok / 4, mix / self.vis_dim ** 0.5

    def encode_images(self, images: Sequence[np.ndarray], budget: int = 0) -> list[torch.Tensor]:
        out = []
        for image in images:
            gh, gw = image.shape[0] // FACTOR, image.shape[1] // FACTOR
            cells = image[:gh * FACTOR, :gw * FACTOR].reshape(gh, FACTOR, gw, FACTOR, 3).mean(axis=(1, 3))
            cells = torch.from_numpy(cells.reshape(gh * gw, 3).astype(np.float32))
            index = torch.arange(gh * gw, dtype=torch.float32)[:, None]
            feats = torch.cat([cells, cells ** 2, torch.sin(index * torch.arange(1, 43) / 7)], dim=1)   # [n, 48]
            out.append((feats @ self.pix_basis).to(torch.bfloat16))
        return out

    def hidden(self, token_lists: Sequence[Sequence[int]], vision: Sequence[Spliced]) -> list[torch.Tensor]:
        out = []
        for tokens, images in zip(token_lists, vision):
            ids = torch.tensor(tokens) % 64
            x = torch.nn.functional.one_hot(ids, 64).float()
            x[:, 0] += torch.arange(len(tokens)) / 100
            rows = x @ self.tok_basis                                                    # [L, out]
            for start, v in images:
                rows[start:start + v.shape[0]] += v.float() @ self.vis_mix
            out.append(rows.to(torch.bfloat16).float())
        return out

    def embed_table(self) -> None:
        return None


# ---------------------------------------------------------------- Qwen-Image 2.1: the unreduced model

class VisionOut:
    """One image through the tower: the merger's main rows, the deepstack rows per level (on the CPU in the
    teacher's dtype; the shard stores the main rows as bf16), the merged grid."""

    __slots__ = ("rows", "deepstack", "grid")

    def __init__(self, rows: torch.Tensor, deepstack: list[torch.Tensor], grid: tuple[int, int]):
        self.rows, self.deepstack, self.grid = rows, deepstack, grid

    @property
    def shape(self) -> torch.Size:
        return self.rows.shape


def mrope_positions(length: int, tokens: int, blocks: Sequence[tuple[int, tuple[int, int]]]) -> torch.Tensor:
    """[3, length] M-RoPE positions of one sample (Qwen3-VL's get_rope_index for images): text advances
    t, h and w together; an image block of (gh, gw) merged tokens starting at p gets t = p, h = p + row,
    w = p + col, and the text after it resumes at p + max(gh, gw); positions past `tokens` (pads) are 1."""
    pos = torch.ones(3, length, dtype=torch.long)
    starts = dict(blocks)
    i, p = 0, 0
    while i < tokens:
        if i in starts:
            gh, gw = starts[i]
            k = torch.arange(gh * gw)
            pos[0, i:i + gh * gw] = p
            pos[1, i:i + gh * gw] = p + k // gw
            pos[2, i:i + gh * gw] = p + k % gw
            i += gh * gw
            p += max(gh, gw)
        else:
            pos[:, i] = p
            i += 1
            p += 1
    return pos


class Qwen3VLFullTeacher(Qwen3VLTeacher):
    """Qwen-Image 2.1's teacher: Hugging Face's own forward of Qwen3-VL-8B — deepstack features added
    into the first decoder layers at the image positions, real M-RoPE positions, and the tap before the
    final RMSNorm (the input of `language_model.norm`: transformers 5's hidden_states[-1] is normed)."""

    def encode_images(self, images: Sequence[np.ndarray], budget: int) -> list[VisionOut]:  # type: ignore[override]
        out: list[VisionOut] = []
        for res, grids, sizes in self._tower(images, budget):
            mains = res.pooler_output.split(sizes)
            levels = [d.split(sizes) for d in res.deepstack_features]
            for j, (_, gh, gw) in enumerate(grids):   # kept in the compute dtype: the text stack gets what HF's gets
                out.append(VisionOut(mains[j].to("cpu"), [lv[j].to("cpu") for lv in levels],
                                     (gh // MERGE, gw // MERGE)))
        return out

    def hidden(self, token_lists: Sequence[Sequence[int]], vision: Sequence[Spliced]) -> list[torch.Tensor]:
        """Per sample, the pre-norm rows [len, out_dim] float32 on the CPU (every position, slots included)."""
        ids, mask = pad_batch(token_lists, PAD_ID)
        length = ids.shape[1]
        positions = torch.stack([mrope_positions(length, len(tokens), [(s, v.grid) for s, v in images])
                                 for tokens, images in zip(token_lists, vision)], dim=1)     # [3, B, L]
        dev = self.exec_device
        captured: list[torch.Tensor] = []
        hook = self.model.language_model.norm.register_forward_hook(lambda mod, args, out: captured.append(args[0]))
        try:
            with torch.inference_mode():
                x = self.embed.to(dev)[ids.to(dev)].to(self.dtype)                       # [B, L, H]
                visual = torch.zeros(len(token_lists), length, dtype=torch.bool)
                levels: list[list[torch.Tensor]] = []
                for b, images in enumerate(vision):                                      # row-major: sample, position
                    for start, v in sorted(images, key=lambda item: item[0]):
                        n = v.rows.shape[0]
                        x[b, start:start + n] = v.rows.to(dev, self.dtype)
                        visual[b, start:start + n] = True
                        levels = levels or [[] for _ in v.deepstack]
                        for level, rows in zip(levels, v.deepstack):
                            level.append(rows.to(dev, self.dtype))
                deepstack = [torch.cat(level) for level in levels] if levels else None
                self.model.language_model(inputs_embeds=x, attention_mask=mask.long().to(dev),
                                          position_ids=positions.to(dev),
                                          visual_pos_masks=visual.to(dev) if deepstack else None,
                                          deepstack_visual_embeds=deepstack)
        finally:
            hook.remove()
        pre_norm = captured[-1]
        return [pre_norm[b, :len(t)].to("cpu", torch.float32) for b, t in enumerate(token_lists)]
