"""The Ming-Image teacher: caption rows [256, cap_dim] and direct rows [P, out_dim] per prompt
(packs-contract-more §D.1 2), and the Ling vision rows the adapter reads.

* **Parts.** The Ling thinker in plain torch (ling.py), the connector and the mlp/ projections
  (connector.py) and the vision tower + linear_proj + L2 norm (vision.py), all strictly from the
  snapshot's safetensors; the Ling tokenizer from `mllm/tokenizer.json` (tokenizers).
* **Vision.** `encode_images` takes images preprocessed as the engine does (template.preprocess_image)
  and returns one unit row per merged 28 × 28 cell, in the raster order of the `<imagePatch>` slots,
  with the engine's tanh GELU (what the adapter meets at inference); `budget` merged tokens a batch.
* **Targets.** `targets` runs the thinker over [prompt ids ; <image> 256 queries </image>] with the
  input image's rows over its `<imagePatch>` run, right-padded with `<|role_end|>` (connector.ming_targets).
* **Placement** (`precompute.teacher_mode`): `gpu` keeps every part on the card; `offload` keeps the
  thinker's layers in RAM and computes each on the card (accelerate's cpu_offload), the rest resident;
  `auto` picks `gpu` when the budget holds the weights (bf16) + 3 GiB; without CUDA everything runs on
  the CPU in float32.

`MockMingTeacher` (§D.1 3) gives deterministic rows of the same shapes with no model.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.common.mock_teachers import HashTokenizer, cell_features, mock_tokenizer, seeded_normal
from trainer_core.packs.common.snapshot_teacher import SnapshotTeacher
from trainer_core.packs.ming_image.connector import ThinkerPrompt, load_ming_parts, ming_targets
from trainer_core.packs.ming_image.ling import REPO
from trainer_core.packs.ming_image.template import (FACTOR, IMAGE_END, IMAGE_PATCH, IMAGE_START, NUM_QUERIES, PAD_TOKEN,
                                                    encoder, pad_id, patchify)
from trainer_core.packs.ming_image.vision import MingVision, tokens_per_image

__all__ = ["MingTeacher", "MockMingTeacher", "Prompt", "weights_gib", "MOCK_SPECIALS"]

Prompt = tuple[Sequence[int], int, "torch.Tensor | None", "tuple[int, int] | None"]   # ids, image_start, rows, grid


def weights_gib(root: str | os.PathLike) -> float:
    """The snapshot's weights in GiB at bf16 (the connector is stored f32): what a resident teacher holds."""
    import json
    total = 0.0
    for folder in ("mllm", "connector", "mlp"):
        for path in sorted((Path(root) / folder).glob("*.safetensors")):
            with open(path, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            for name, info in header.items():
                if name != "__metadata__":
                    size = info["data_offsets"][1] - info["data_offsets"][0]
                    total += size / 2 if info.get("dtype") == "F32" else size
    return total / 2**30


def _grid(image: np.ndarray) -> tuple[int, int]:
    """The merged grid (rows, columns) of a preprocessed image."""
    return image.shape[0] // FACTOR, image.shape[1] // FACTOR


def resident_need_gib(root: str | os.PathLike) -> float:
    """What a resident Ming teacher needs on the card (TrainerPack.teacher_need_gib): its weights plus the
    Qwen3-VL teachers' headroom."""
    from trainer_core.packs.common.qwen3vl.teacher import RESIDENT_HEADROOM_GIB
    return weights_gib(root) + RESIDENT_HEADROOM_GIB


def choose_mode(root: str | os.PathLike, mode: str, device: torch.device, gpu_mem_gib: float) -> str:
    """The placement MingTeacher takes for the snapshot at `root` (the plan asks the same rule)."""
    from trainer_core.packs.common.qwen3vl.teacher import resolve_mode
    return resolve_mode(mode, device, gpu_mem_gib, weights_gib(root))


class MingTeacher(SnapshotTeacher):
    """The real teacher from a Ming-Image snapshot folder (see the module docstring)."""

    placement = staticmethod(choose_mode)

    def _read(self) -> None:
        from tokenizers import Tokenizer
        path = self.root / "mllm" / "tokenizer.json"
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 — the tokenizers library raises plain Exception subclasses
            raise ModelFileError(f"The Ling tokenizer {path} cannot be loaded ({e}); download {REPO} again.") from None
        self.encode = encoder(self.tokenizer)

    def _load(self) -> None:
        here = self.device if self.mode == "gpu" else torch.device("cpu")
        self.parts = load_ming_parts(self.root, self.dtype, here)
        self.vision = MingVision.load(self.root / "mllm", here, self.dtype)
        p = self.parts
        self._settle(None, resident=(p.thinker.word_embeddings, p.thinker.norm, p.connector, p.projections,
                                     self.vision), streamed=p.thinker.layers)
        self.pad = pad_id(self.encode)
        self.out_dim, self.cap_dim = self.parts.mlp.direct_dim, self.parts.mlp.cap_dim
        self.vis_dim, self.num_queries = self.vision.hidden, self.parts.num_queries

    def _summary(self) -> str:
        return (f"Ming teacher: thinker {self.parts.thinker.config.num_hidden_layers} layers, caption rows "
                f"{self.num_queries} × {self.cap_dim}, direct rows {self.out_dim}-d, vision rows {self.vis_dim}-d "
                f"({weights_gib(self.root):.1f} GiB bf16), {self.mode} on {self.device}")

    def encode_images(self, images: Sequence[np.ndarray], budget: int = 0) -> list[torch.Tensor]:
        """Per preprocessed image [h, w, 3], its unit rows [(h/28)·(w/28), vis_dim] bf16 on the CPU, in
        batches of at most `budget` merged tokens (0: all at once)."""
        from trainer_core.packs.common.qwen3vl.teacher import image_batches
        counts = [a * b for a, b in map(_grid, images)]
        out: list[torch.Tensor] = []
        for batch in image_batches(counts, budget or sum(counts)):
            rows, grids = zip(*(patchify(np.asarray(images[i], dtype=np.float32)) for i in batch))
            pixels = torch.from_numpy(np.concatenate(rows)).to(self.exec_device, self.dtype)
            encoded = self.vision.encode(pixels, list(grids))
            out.extend(r.to("cpu", torch.bfloat16) for r in encoded.split(tokens_per_image(list(grids))))
        return out

    def targets(self, prompts: Sequence[Prompt]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(caption rows [B, 256, cap_dim], direct rows [P_i, out_dim] per prompt), float32 on the CPU."""
        thinker_prompts = [ThinkerPrompt(list(ids), rows, start, grid) for ids, start, rows, grid in prompts]
        cap, direct = ming_targets(self.parts, thinker_prompts, self.pad)
        return cap.float(), [d.float() for d in direct]

    def embed_table(self) -> torch.Tensor:
        """The thinker's input embedding table [vocab, hidden] (the seed table's PCA source)."""
        return self.parts.thinker.word_embeddings.weight.detach()


# ---------------------------------------------------------------- the mock

# the stand-in ids of the mock's word-hash tokenizer (no tokenizer.json): the reference mock's guesses
MOCK_SPECIALS = {"<role>": 157151, "</role>": 157152, PAD_TOKEN: 156895, "<imagePatch>": IMAGE_PATCH,
                 "<image>": IMAGE_START, "</image>": IMAGE_END}
# specials by their ids, "\n" 6, a blank stretch 7, any other word 1000 + crc32 mod 150000
_hash_encode = HashTokenizer(MOCK_SPECIALS, newline=6, blank=7, buckets=150000)


class MockMingTeacher:
    """Deterministic rows of the teacher's shapes (§D.1 3), with no model.

    Images: per 28 × 28 cell its mean colour, the square of it and 42 sines of the cell index (48
    features) times a fixed basis, L2-normalized → [cells, vis_dim]. Direct rows: one-hot(id mod 64)
    with position/100 added to column 0, times a basis, plus the image's rows mixed into its
    <imagePatch> run. Caption row q: the prompt's ids mod 64 as a multi-hot vector × (q + 1)/64 times a
    basis, plus 0.1 · the image's mean row mixed (its first cap_dim columns) with an image."""

    mode = "mock"

    def __init__(self, out_dim: int = 3840, cap_dim: int = 2560, vis_dim: int = 2048, tokenizer: Any = None,
                 num_queries: int = NUM_QUERIES):
        self.out_dim, self.cap_dim, self.vis_dim, self.num_queries = int(out_dim), int(cap_dim), int(vis_dim), \
            int(num_queries)
        self.tokenizer = tokenizer = mock_tokenizer(tokenizer, "Ling", REPO)
        self.encode = encoder(tokenizer) if tokenizer is not None else _hash_encode
        self.pad = pad_id(self.encode)
        tok, cap, pix, mix = seeded_normal((64, self.out_dim), (64, self.cap_dim), (48, self.vis_dim),
                                           (self.vis_dim, self.out_dim))
        self.tok_basis, self.cap_basis, self.pix_basis = tok / 4, cap / 4, pix / 4
        self.vis_mix = mix / self.vis_dim ** 0.5

    def encode_images(self, images: Sequence[np.ndarray], budget: int = 0) -> list[torch.Tensor]:
        """Per preprocessed image [h, w, 3], [(h/28)·(w/28), vis_dim] unit rows bf16 (`budget` unused)."""
        out = []
        for image in images:
            gh, gw = _grid(image)
            feats = cell_features(image, gh, gw, FACTOR)                                  # [n, 48]
            out.append(torch.nn.functional.normalize(feats @ self.pix_basis, dim=-1).to(torch.bfloat16))
        return out

    def targets(self, prompts: Sequence[Prompt]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The real teacher's shapes, float32 holding bf16 values."""
        caps, directs = [], []
        q = torch.arange(1, self.num_queries + 1, dtype=torch.float32)[:, None] / 64                  # [Q, 1]
        for ids, start, rows, _grid_ in prompts:
            ids_t = torch.tensor(list(ids)) % 64
            x = torch.nn.functional.one_hot(ids_t, 64).float()
            x[:, 0] += torch.arange(len(ids)) / 100
            direct = x @ self.tok_basis                                                              # [P, out]
            hot = torch.zeros(64)
            hot[ids_t] = 1.0
            cap = (q * hot) @ self.cap_basis                                                         # [Q, cap]
            if rows is not None:
                v = rows.float()                                                                     # [n, vis]
                if start < 0 or any(t != IMAGE_PATCH for t in list(ids)[start:start + len(v)]):
                    raise ValueError("the image rows do not match the prompt's <imagePatch> run")
                direct[start:start + len(v)] += v @ self.vis_mix
                cap = cap + 0.1 * (v.mean(0) @ self.vis_mix)[:self.cap_dim]
            directs.append(direct.to(torch.bfloat16).float())
            caps.append(cap.to(torch.bfloat16).float())
        cap_out = torch.stack(caps) if caps else torch.zeros(0, self.num_queries, self.cap_dim)
        return cap_out, directs

    def embed_table(self) -> None:
        return None
