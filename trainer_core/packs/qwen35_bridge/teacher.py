"""The MOSS-Image teacher: Qwen3.5-9B's last hidden state per template token (packs-contract-more §D.2 2a).

* **Rows.** One batched forward of transformers' own `Qwen3_5Model` over the MOSS template ids
  (template.py), right-padded with <|endoftext|>, with the references' patches: HF splices the
  vision tower's rows into the <|image_pad|> runs and computes the M-RoPE positions itself
  (`mm_token_type_ids` marks the pads). The target is `last_hidden_state`, after the final
  RMSNorm, one row per real token. Qwen3.5 has no deepstack; a snapshot that declares deepstack
  levels is refused, as is any vision geometry other than patch 16 / merge 2.
* **Vision embeds.** A separate `get_image_features` pass gives the tower's raw main output per
  reference (`pooler_output`, one row per merged 32 × 32 cell; not normalized, not projected),
  in batches of at most `budget` merged tokens.
* **Placement** (`precompute.teacher_mode`) as the Qwen3-VL teachers: `gpu` keeps the model on the
  card; `offload` keeps the decoder layers' weights in RAM and computes each on the card
  (accelerate's cpu_offload), everything else resident; `auto` picks `gpu` when the budget holds
  the text stack + 4 GiB; without CUDA everything runs on the CPU.

`MockQwen35Teacher` gives deterministic rows of the same shapes with no model, and
`tokenizer_arrays` the vocabulary and merges the adapter GGUF carries for the engine.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.batching import pad_batch
from trainer_core.packs.qwen35_bridge.template import (FACTOR, FIRST_SPECIAL_ID, IMAGE_PAD, PAD_ID, SPECIAL_TOKENS,
                                                       merged_tokens, patchify)
from trainer_core.packs.common.mock_teachers import HashTokenizer, cell_features, mock_tokenizer, seeded_normal
from trainer_core.packs.common.snapshot_teacher import SnapshotTeacher
from trainer_core.packs.common.qwen3vl.teacher import (RESIDENT_HEADROOM_GIB, check_rope, image_batches, resolve_mode,
                                                      text_weights_gib)

__all__ = ["Qwen35Teacher", "MockQwen35Teacher", "tokenizer_arrays", "AUDIO_TOKENS", "Sample"]

Sample = tuple[Sequence[int], Sequence[np.ndarray]]     # (template ids, its references [h, w, 3] in −1…1)
AUDIO_TOKENS = SPECIAL_TOKENS[26:]                      # <|audio_start|> … <|audio_pad|>, missing from some files
_REPO = "Qwen/Qwen3.5-9B"
_EXTRA_HEADROOM_GIB = 1.0                               # resolve_mode keeps 3 GiB; the 9B wants 4


def resident_need_gib(root: str | os.PathLike) -> float:
    """What a resident Qwen3.5 teacher needs on the card (TrainerPack.teacher_need_gib): text stack + 4 GiB."""
    return text_weights_gib(root) + RESIDENT_HEADROOM_GIB + _EXTRA_HEADROOM_GIB


def choose_mode(root: str | os.PathLike, mode: str, device: torch.device, gpu_mem_gib: float) -> str:
    """The placement Qwen35Teacher takes for the snapshot at `root` (the plan asks the same rule)."""
    return resolve_mode(mode, device, gpu_mem_gib, text_weights_gib(root) + _EXTRA_HEADROOM_GIB)


def _load_snapshot(root: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """(the snapshot's tokenizers.Tokenizer, transformers' Qwen3_5Model in `dtype`), or ModelFileError."""
    from tokenizers import Tokenizer
    from transformers import AutoModel, Qwen3_5Model
    try:
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 — the tokenizers library raises plain Exception subclasses
        raise ModelFileError(f"The teacher tokenizer {root / 'tokenizer.json'} cannot be loaded ({e}); download "
                             f"{_REPO} again.") from None
    try:
        model = AutoModel.from_pretrained(root, dtype=dtype)
    except (OSError, ValueError, KeyError) as e:
        raise ModelFileError(f"The Qwen3.5 teacher in {root} cannot be loaded ({type(e).__name__}: {e}); download "
                             f"{_REPO} again.") from None
    if not isinstance(model, Qwen3_5Model):
        raise ModelFileError(f"{root} holds a {type(model).__name__}, not a Qwen3.5 model; download {_REPO} again.")
    return tokenizer, model


class Qwen35Teacher(SnapshotTeacher):
    """The real teacher from a Qwen3.5 snapshot folder (see the module docstring)."""

    placement = staticmethod(choose_mode)

    def _read(self) -> None:
        def read(config: Any) -> tuple[Any, tuple[int, int, int], int, int]:
            v = config.vision_config
            return (v, (int(v.patch_size), int(v.spatial_merge_size), int(v.temporal_patch_size)),
                    int(v.out_hidden_size), int(config.text_config.hidden_size))
        vision, geometry, self.vis_dim, self.out_dim = self._config("Qwen3.5", _REPO, read)
        if geometry != (16, 2, 2):
            raise ModelFileError(f"The teacher's vision tower uses patch {geometry[0]}, merge {geometry[1]} and "
                                 f"temporal {geometry[2]}; the engine's MOSS-Image path needs 16, 2 and 2.")
        if getattr(vision, "deepstack_visual_indexes", None):
            raise ModelFileError(f"The teacher's vision tower declares deepstack levels "
                                 f"{list(vision.deepstack_visual_indexes)}; Qwen3.5 has none and the engine uses "
                                 f"none, so this is not {_REPO}.")

    def _load(self) -> None:
        self.tokenizer, model = _load_snapshot(self.root, self.dtype)
        model.eval().requires_grad_(False)
        check_rope(model)
        lm = model.language_model
        self._settle(model, resident=(model.visual, lm.embed_tokens, lm.norm, lm.rotary_emb), streamed=lm.layers)
        self.model = model

    def _summary(self) -> str:
        return (f"Qwen3.5 teacher: text {self.out_dim}-d ({text_weights_gib(self.root):.1f} GiB), vision rows "
                f"{self.vis_dim}-d, {self.mode} on {self.device}")

    def encode(self, text: str) -> list[int]:
        """The teacher's ids of a whole string, no special tokens added (specials in it are matched)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _pixels(self, images: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values [Σ patches, 1536], image_grid_thw [n, 3]) on the execution device."""
        rows, grids = zip(*(patchify(np.asarray(im, dtype=np.float32)) for im in images))
        pixels = torch.from_numpy(np.concatenate(rows)).to(self.exec_device, self.dtype)
        return pixels, torch.tensor(grids, dtype=torch.long, device=self.exec_device)

    def encode_images(self, images: Sequence[np.ndarray], budget: int) -> list[torch.Tensor]:
        """Per reference [h, w, 3], the tower's raw main rows [(h/32)·(w/32), vis_dim] bf16 on the CPU;
        `budget` merged tokens per tower batch (0: all at once)."""
        tokens = [merged_tokens(*im.shape[:2]) for im in images]
        out: list[torch.Tensor] = []
        for batch in image_batches(tokens, budget or sum(tokens)):
            pixels, grids = self._pixels([images[i] for i in batch])
            with torch.inference_mode():
                rows = self.model.get_image_features(pixels, image_grid_thw=grids).pooler_output
            out.extend(r.to("cpu", torch.bfloat16) for r in rows)
        return out

    def hidden(self, samples: Sequence[Sample]) -> list[torch.Tensor]:
        """Per sample, the final-norm rows [len(ids), out_dim] float32 on the CPU (the shard stores
        bf16); one right-padded batch through Qwen3_5Model with its references."""
        token_lists = [list(ids) for ids, _ in samples]
        images = [im for _, refs in samples for im in refs]
        for ids, refs in zip(token_lists, (refs for _, refs in samples)):
            want = sum(merged_tokens(*im.shape[:2]) for im in refs)
            if ids.count(IMAGE_PAD) != want:
                raise ValueError(f"a sample has {ids.count(IMAGE_PAD)} image pads for references of {want} tokens")
        ids, mask = pad_batch(token_lists, PAD_ID)
        dev = self.exec_device
        ids = ids.to(dev)
        vision: dict[str, torch.Tensor] = {}
        if images:
            vision["pixel_values"], vision["image_grid_thw"] = self._pixels(images)
        self.model.rope_deltas = None                    # HF caches M-RoPE deltas between calls
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask.long().to(dev),
                             mm_token_type_ids=(ids == IMAGE_PAD).int(), use_cache=False,
                             **vision).last_hidden_state                                  # [B, L, out]
        self.model.rope_deltas = None
        return [out[b, :len(t)].to("cpu", torch.float32) for b, t in enumerate(token_lists)]

    def embed_table(self) -> torch.Tensor:
        """The text stack's input embedding table [vocab, out_dim] (the seed table's PCA source)."""
        return self.model.language_model.embed_tokens.weight.detach()


# ---------------------------------------------------------------- the mock

# the mock's tokenizer without a tokenizer.json: specials by their ids, "user" 846, "assistant" 74455, "\n" 198,
# a blank stretch 220, any other word 1000 + crc32 mod 240000
_hash_encode = HashTokenizer({t: FIRST_SPECIAL_ID + i for i, t in enumerate(SPECIAL_TOKENS)}, newline=198, blank=220,
                             buckets=240000, words={"user": 846, "assistant": 74455})


class MockQwen35Teacher:
    """Deterministic rows of the teacher's shapes (§D.2 3), with no model.

    Images: per 32 × 32 cell its mean colour, the square of it and 42 sines of the cell index (48
    features) times a fixed basis → [cells, vis_dim] bf16. Text: one-hot(id mod 64) with position/100
    added to column 0, times a basis, plus each reference's rows mixed into its <|image_pad|> run."""

    mode = "mock"

    def __init__(self, out_dim: int = 4096, vis_dim: int = 4096, tokenizer: Any = None):
        self.out_dim, self.vis_dim = int(out_dim), int(vis_dim)
        self.tokenizer = mock_tokenizer(tokenizer, "teacher", _REPO)
        tok, pix, mix = seeded_normal((64, self.out_dim), (48, self.vis_dim), (self.vis_dim, self.out_dim))
        self.tok_basis, self.pix_basis, self.vis_mix = tok / 4, pix / 4, mix / self.vis_dim ** 0.5

    def encode(self, text: str) -> list[int]:
        """The tokenizer.json's ids of a whole string, or the word-hash ids when there is none."""
        if self.tokenizer is None:
            return _hash_encode(text)
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_images(self, images: Sequence[np.ndarray], budget: int = 0) -> list[torch.Tensor]:
        """Per reference [h, w, 3], [(h/32)·(w/32), vis_dim] bf16 (`budget` is not needed here)."""
        out = []
        for image in images:
            gh, gw = image.shape[0] // FACTOR, image.shape[1] // FACTOR
            out.append((cell_features(image, gh, gw, FACTOR) @ self.pix_basis).to(torch.bfloat16))
        return out

    def hidden(self, samples: Sequence[Sample]) -> list[torch.Tensor]:
        """Per sample [len(ids), out_dim] float32 holding bf16 values, as the real teacher's rows."""
        out = []
        for ids, refs in samples:
            x = torch.nn.functional.one_hot(torch.tensor(list(ids)) % 64, 64).float()
            x[:, 0] += torch.arange(len(ids)) / 100
            rows = x @ self.tok_basis                                                        # [L, out]
            pads = [i for i, t in enumerate(ids) if t == IMAGE_PAD]
            v = torch.cat(self.encode_images(refs)).float() if refs else torch.zeros(0, self.vis_dim)   # [Σ n, vis]
            if v.shape[0] != len(pads):
                raise ValueError(f"a sample has {len(pads)} image pads for references of {v.shape[0]} tokens")
            rows[pads] += v @ self.vis_mix
            out.append(rows.to(torch.bfloat16).float())
        return out

    def embed_table(self) -> None:
        return None


# ---------------------------------------------------------------- the vocabulary in the GGUF

def tokenizer_arrays(tokenizer_json: str | os.PathLike, vocab_rows: int = 248320) -> tuple[list[str], list[str]]:
    """(tokens, merges) for `tokenizer.ggml.tokens` / `.merges`: the BPE vocabulary and the added tokens
    by id, any missing audio token appended after the highest id, unused ids as "[PAD<i>]", at least
    `vocab_rows` entries; the merges as "a b" strings."""
    path = Path(tokenizer_json)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = data["model"]
        by_id = {int(i): str(t) for t, i in model["vocab"].items()}
        by_id.update({int(a["id"]): str(a["content"]) for a in data.get("added_tokens", [])})
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelFileError(f"The teacher tokenizer {path} is missing or unreadable ({type(e).__name__}: {e}); "
                             f"download the teacher ({_REPO}) again.") from None
    present = set(by_id.values())
    for name in AUDIO_TOKENS:
        if name not in present:
            by_id[max(by_id, default=-1) + 1] = name
    n = max(vocab_rows, max(by_id, default=-1) + 1)
    return [by_id.get(i, f"[PAD{i}]") for i in range(n)], merges
