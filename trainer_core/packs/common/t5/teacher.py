"""The T5 teachers: a T5 v1.1 encoder over the engine's caption window, and the window rules of its families.

The window is what ggk's T5 embedders build, with the engine's own T5 tokenizer (contract/engine_t5.py, not
sentencepiece or Hugging Face's): the raw prompt's pieces, EOS (1) appended, truncated to window − 1 pieces +
EOS, padded with 0 to `window` slots (PixArt 120, Chroma 512). A prompt's real slots are its pieces plus EOS (an
empty prompt is [▁, EOS]). Two rules differ between the families:

* **The key mask** (`key_mask`). PixArt's encoder masks the pads as keys. T5 is bidirectional with a relative
  position bias, so a real row then does not depend on how many pads follow it: the batch runs over its longest
  real length only, and its rows equal a full window's bit for bit. Chroma's runs the whole window with no mask
  (`chroma_use_t5_mask` false, conditioner.hpp:1504-1506): every slot is a key, so every batch runs the full
  window and a real row sees the pads after it.
* **The rows the DiT reads** (`dit_pad_slots`): PixArt's the real slots; Chroma's also the first pad slot
  (`chroma_t5_mask_pad` 1), min(real + 1, window) rows a prompt. Those are the supervised rows.

Nothing here knows about projects or stages: the pack hands in the snapshot folder, the device, the memory
settings and the window's rules. `MockT5Teacher` gives deterministic synthetic targets of the same shapes
without any file.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Sequence

import torch

from trainer_core.contract import placement
from trainer_core.contract.batching import greedy_batches
from trainer_core.contract.devices import is_big_card, place_teacher
from trainer_core.contract.engine_t5 import EOS_ID, PAD_ID, EngineT5
from trainer_core.base.errors import ModelFileError

__all__ = [
    "T5_WINDOW", "T5_EOS", "T5_PAD", "TEACHER_MODES", "load_t5_tokenizer", "seed_windows",
    "teacher_weights_gib", "resolve_teacher_mode", "resident_need_gib", "choose_mode", "T5Teacher", "MockT5Teacher",
    "auto_budgets", "supervised_lens",
    "greedy_batches",
]

T5_WINDOW = 120      # PixArt's caption length: slots per prompt (y_embedding is [4096, 120])
T5_EOS = EOS_ID      # </s> (1), appended after the pieces; the last real slot
T5_PAD = PAD_ID      # <pad> (0), fills the window after EOS

TEACHER_MODES = placement.TEACHER_MODES
_RESIDENT_HEADROOM_GIB = 2.5   # activations and the CUDA context next to the resident weights
_ASSUMED_WEIGHTS_GIB = 9.5     # T5-XXL v1.1 encoder in bf16, when the file is not there to measure

# §A.5 auto values for the seeded pack (a setting of 0 means "use these")
_BIG_CARD_BUDGETS = {"teacher_batch": 256, "tok_budget": 24576, "student_batch": 256}
_SMALL_CARD_BUDGETS = {"teacher_batch": 64, "tok_budget": 8192, "student_batch": 64}


# ---------------------------------------------------------------- tokenizer and windows

def load_t5_tokenizer(root: str | os.PathLike) -> EngineT5:
    """The engine's T5 tokenizer over a snapshot folder's vocabulary (spiece.model, or
    tokenizer.json), checked to mean by PAD and EOS what the engine writes into the window."""
    tokenizer = EngineT5.from_folder(root)
    # The engine pads with id 0 and ends with id 1 whatever the vocabulary says; the teacher
    # must read those ids as <pad> and </s>.
    if tokenizer.piece_id("<pad>") != T5_PAD or tokenizer.piece_id("</s>") != T5_EOS:
        raise ModelFileError(f"The T5 tokenizer in {root} does not have </s> = {T5_EOS} and "
                             f"<pad> = {T5_PAD}; it is not a T5 v1.1 tokenizer.")
    return tokenizer


def seed_windows(tokenizer: EngineT5, prompts: Sequence[str], window: int = T5_WINDOW
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids LongTensor [B, window], lens LongTensor [B]) for the raw prompts as the engine builds
    them: pieces + EOS, truncated to window − 1 pieces + EOS, padded with 0; len counts the real
    slots (≥ 2: even the empty prompt is [▁, EOS])."""
    return tokenizer.windows(prompts, window)


def supervised_lens(real_lens: torch.Tensor, window: int, dit_pad_slots: int) -> torch.Tensor:
    """The rows the DiT reads per prompt, min(real + dit_pad_slots, window), from the real slot counts."""
    return (real_lens + dit_pad_slots).clamp(max=window) if dit_pad_slots else real_lens


# ---------------------------------------------------------------- memory placement

def teacher_weights_gib(root: str | os.PathLike) -> float:
    """Size of the encoder's weights on disk in GiB (9.5 when there is no file to measure)."""
    root = Path(root)
    files = [root / "model.safetensors"]
    if not files[0].is_file():
        files = sorted(root.glob("model-*.safetensors"))   # a sharded snapshot
    if not files:
        return _ASSUMED_WEIGHTS_GIB
    return sum(f.stat().st_size for f in files) / 2**30


def resolve_teacher_mode(mode: str, device: torch.device, gpu_mem_gib: float, weights_gib: float) -> str:
    """"gpu" (resident on a CUDA card), "offload" (weights in RAM, streamed layer by layer to
    the device) or "cpu" (resident on the CPU), by contract/placement.py's rule: `auto` keeps the teacher
    resident when the GPU budget holds its weights plus 2.5 GiB; `gpu_mem_gib` 0 means the card's total − 1.5 GiB."""
    return place_teacher(mode, device, gpu_mem_gib, weights_gib + _RESIDENT_HEADROOM_GIB)


def resident_need_gib(root: str | os.PathLike) -> float:
    """What a resident encoder needs on the card: its weights plus the headroom (TrainerPack.teacher_need_gib)."""
    return teacher_weights_gib(root) + _RESIDENT_HEADROOM_GIB


def choose_mode(root: str | os.PathLike, mode: str, device: torch.device, gpu_mem_gib: float) -> str:
    """The placement T5Teacher takes for the snapshot at `root` (the plan asks the same rule)."""
    return resolve_teacher_mode(mode, device, gpu_mem_gib, teacher_weights_gib(root))


def auto_budgets(device: str | torch.device) -> dict[str, int]:
    """teacher_batch, tok_budget and student_batch for a setting of 0: the big-card values on a
    CUDA card over 24e9 bytes, the small-card ones otherwise (the CPU included)."""
    big = is_big_card(torch.device(device))
    return dict(_BIG_CARD_BUDGETS if big else _SMALL_CARD_BUDGETS)


# ---------------------------------------------------------------- teachers

class _WindowTeacher:
    """What both teachers share: windows in, rows at the real slots out."""

    def seed_windows(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def real_rows(self, prompts: Sequence[str]) -> list[torch.Tensor]:
        """One [len_i, out_dim] float32 tensor per prompt (EOS row included), in one batch."""
        ids, lens = self.seed_windows(prompts)
        out = self.forward(ids, lens)                                 # [B, L, out_dim]
        return [out[i, :int(n)] for i, n in enumerate(lens)]


def _check_windows(ids: torch.Tensor, lens: torch.Tensor) -> int:
    """The batch's longest real length L, after checking the shapes agree."""
    if ids.dim() != 2 or lens.shape != ids.shape[:1]:
        raise ValueError(f"expected ids [B, window] and lens [B], got {list(ids.shape)} and "
                         f"{list(lens.shape)}")
    if ids.shape[0] == 0:
        return 0
    longest = int(lens.max())
    if int(lens.min()) < 1 or longest > ids.shape[1]:
        raise ValueError(f"every len must be in 1..{ids.shape[1]}, got {int(lens.min())}..{longest}")
    return longest


class T5Teacher(_WindowTeacher):
    """T5EncoderModel from a snapshot folder (bf16 on CUDA, float32 on the CPU), placed by
    `mode`: "gpu" resident on `device`, "offload" streamed from RAM by accelerate, "auto"
    choosing between them from `gpu_mem_gib` (resident on a CPU device); the window's rules
    (`window`, `key_mask`, `dit_pad_slots`: the module docstring) are the family's."""

    def __init__(self, root: str | os.PathLike, device: str | torch.device = "cpu", mode: str = "auto",
                 gpu_mem_gib: float = 0.0, window: int = T5_WINDOW, key_mask: bool = True, dit_pad_slots: int = 0):
        from transformers import T5EncoderModel

        self.window, self.key_mask, self.dit_pad_slots = int(window), bool(key_mask), int(dit_pad_slots)
        self.root = Path(root)
        self.device = torch.device(device)
        self.mode = choose_mode(self.root, mode, self.device, gpu_mem_gib)
        self.tokenizer = load_t5_tokenizer(self.root)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        try:
            # eager attention: CPU SDPA blocks its reduction by key count, so the real rows
            # would move by ~1e-6 with the pad count; eager keeps them bit-identical.
            model = T5EncoderModel.from_pretrained(self.root, dtype=dtype, attn_implementation="eager")
        except (OSError, ValueError) as e:
            raise ModelFileError(f"The T5 encoder in {self.root} cannot be loaded ({e}); download "
                                 "callgg/t5-v1_1-xxl-encoder-bf16 again.") from None
        model.eval().requires_grad_(False)
        if self.mode == "offload":
            from accelerate import cpu_offload
            model = cpu_offload(model, execution_device=self.device)
        else:
            model = model.to(self.device)
        self.model = model
        self.out_dim = int(model.config.d_model)
        self.vocab_size = int(model.config.vocab_size)
        if len(self.tokenizer) > self.vocab_size:   # T5 v1.1: 32100 ids, 32128 embedding rows
            raise ModelFileError(f"The T5 tokenizer in {self.root} has {len(self.tokenizer)} ids but the "
                                 f"encoder embeds only {self.vocab_size}; download the teacher snapshot again.")

    def seed_windows(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [B, window], lens [B]): the engine's window of each raw prompt and its supervised rows."""
        ids, real = seed_windows(self.tokenizer, prompts, self.window)
        return ids, supervised_lens(real, self.window, self.dit_pad_slots)

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """last_hidden_state [B, L, out_dim] float32 on the CPU for L = max(lens): with the key mask over the
        first L slots, pads masked; without it over the whole window, every slot a key. Rows past each len are
        meaningless."""
        longest = _check_windows(ids, lens)
        if longest == 0:
            return torch.zeros(0, 0, self.out_dim)
        if not self.key_mask:
            if ids.shape[1] != self.window:
                raise ValueError(f"expected ids [B, {self.window}], got {list(ids.shape)}")
            with torch.inference_mode(), torch.autocast(self.device.type, torch.bfloat16,
                                                        enabled=self.device.type == "cuda"):
                hidden = self.model(input_ids=ids.to(self.device)).last_hidden_state     # [B, window, out]
            return hidden[:, :longest].to("cpu", torch.float32)                          # [B, L, out]
        mask = torch.arange(longest)[None, :] < lens.cpu()[:, None]           # [B, L]
        with torch.inference_mode(), torch.autocast(self.device.type, torch.bfloat16,
                                                    enabled=self.device.type == "cuda"):
            hidden = self.model(input_ids=ids[:, :longest].to(self.device),
                                attention_mask=mask.long().to(self.device)).last_hidden_state
        return hidden.to("cpu", torch.float32)                                # [B, L, out_dim]


class MockT5Teacher(_WindowTeacher):
    """Deterministic synthetic targets of the real shapes, with no file and little memory.

    Its "tokenizer" maps each whitespace-split word to 2 + crc32(word) mod (vocab − 2), keeps
    the first window − 1, appends EOS and pads with 0. A slot's row is a low-rank embedding of
    its id plus a position term, then mixed with its left neighbour (x + 0.5·roll(x, 1)) over
    the whole window, so a prompt's rows do not depend on the rest of its batch."""

    mode = "mock"
    _RANK = 32

    def __init__(self, out_dim: int, vocab_size: int, window: int = T5_WINDOW, dit_pad_slots: int = 0):
        if vocab_size < 3 or window < 2:
            raise ValueError(f"the mock needs vocab_size ≥ 3 and window ≥ 2, got {vocab_size} "
                             f"and {window}")
        self.out_dim, self.vocab_size, self.window = int(out_dim), int(vocab_size), int(window)
        self.dit_pad_slots = int(dit_pad_slots)
        self.device = torch.device("cpu")
        g = torch.Generator().manual_seed(4321)
        # table = embed_a @ embed_b / 8 is never formed (526 MB at 32128 × 4096; the factors: 4.7 MB)
        self.embed_a = torch.randn(self.vocab_size, self._RANK, generator=g)     # [vocab, 32]
        self.embed_b = torch.randn(self._RANK, self.out_dim, generator=g)        # [32, out]
        self.pos = torch.randn(self.window, self.out_dim, generator=g) / 8       # [window, out]

    def word_id(self, word: str) -> int:
        return 2 + zlib.crc32(word.encode("utf-8")) % (self.vocab_size - 2)

    def seed_windows(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.full((len(prompts), self.window), T5_PAD, dtype=torch.long)  # [B, window]
        lens = torch.zeros(len(prompts), dtype=torch.long)                      # [B]
        for i, prompt in enumerate(prompts):
            row = [self.word_id(w) for w in prompt.split()][:self.window - 1] + [T5_EOS]
            ids[i, :len(row)] = torch.tensor(row)
            lens[i] = len(row)
        return ids, supervised_lens(lens, self.window, self.dit_pad_slots)

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """[B, L, out_dim] float32: rows 0..L−1 of x + 0.5·roll(x, 1) over the full window."""
        longest = _check_windows(ids, lens)
        if ids.shape[1] != self.window:
            raise ValueError(f"the mock's windows have {self.window} slots, got ids {list(ids.shape)}")
        if longest == 0:
            return torch.zeros(0, 0, self.out_dim)
        # slot i mixes with slot i − 1, and slot 0 with the window's last slot
        slots = torch.cat([torch.tensor([self.window - 1]), torch.arange(longest)])   # [L + 1]
        x = self.embed_a[ids[:, slots].cpu()] @ self.embed_b / 8 + self.pos[slots]     # [B, L + 1, out]
        return x[:, 1:] + 0.5 * x[:, :-1]                                              # [B, L, out]
