"""Krea 2's text contract, which Iris-3B shares (ggk 0.9.7 conditioner.hpp; engine-adapter-families §1.2–1.3):
what the teacher, the student and the adapter see for a prompt.

* **Template.** The MageFlow text-to-image template, byte for byte (conditioner.hpp:3295-3305 against
  3222-3232): the system turn "Describe the image by detailing …", `<|im_start|>user\\n`, the prompt's
  chunks after the engine's attention parse, `<|im_end|>\\n<|im_start|>assistant\\n`. No pads: the engine
  hands the adapter exactly the template's rows, at rope positions 0 … n−1.
* **Slice.** The engine keeps rows from 34 on (the system turn and the user header are dropped after
  the adapter), so only those rows are supervised; the adapter still runs over all of them.
* **Taps.** The target of a row is Qwen3-VL-4B's hidden_states[k] for the 12 taps k = 2, 5, …, 35
  (the output of decoder layer k, before any norm), stacked ascending: 12 × 2560 = 30720.
* **Iris-3B** runs the same adapter with the same template and taps, but caps the caption — the prompt's
  tokens plus the 5-token assistant marker, the marker reserved — at 300 tokens and zero-pads the rest
  after the adapter (conditioner.hpp:2597-2608, 2901-2916). The pack trains on at most 34 + 300 rows,
  cutting a longer prompt's body as Iris does (qwen_chat.fit_template), so what it learns is what both
  engines read.
"""
from __future__ import annotations

from typing import Any, Callable

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.common.qwen3vl.vision_data import SUFFIX, SUFFIX_IDS, T2I_PREFIX, T2I_START, sample_chunks

__all__ = ["TAPS", "SYSTEM_ROWS", "IRIS_CAPTION_CAP", "MAX_ROWS", "taps_for", "template_chunks", "check_template",
           "T2I_PREFIX", "SUFFIX", "SUFFIX_IDS"]

TAPS = tuple(range(2, 36, 3))               # 2, 5, …, 35: the engine's 12 Krea 2 / Iris taps
SYSTEM_ROWS = T2I_START                     # 34: rows the engine drops after the adapter
IRIS_CAPTION_CAP = 300                      # Iris: prompt tokens + the assistant marker, at most
MAX_ROWS = SYSTEM_ROWS + IRIS_CAPTION_CAP   # 334 template rows


def taps_for(n_layers: int) -> tuple[int, ...]:
    """The engine's taps, which need a teacher of at least 36 decoder layers (tap 35 must be an intermediate
    layer's output: hidden_states[n] of an n-layer model is the normed state)."""
    if n_layers <= TAPS[-1]:
        raise ModelFileError(f"The teacher has {n_layers} decoder layers; Krea 2 stacks hidden_states "
                             f"{', '.join(map(str, TAPS))}, so it needs at least {TAPS[-1] + 1} (Qwen3-VL-4B has 36).")
    return TAPS


def template_chunks(text: str) -> list[str]:
    """The pieces the engine encodes one by one: the system turn with the user header, the prompt's chunks
    after the attention parse (none for the empty prompt), the assistant marker."""
    return sample_chunks(text, ())


def check_template(encode: Callable[[str], Any], what: str) -> None:
    """Refuse a tokenizer whose system turn and user header are not the 34 rows the engine drops, or whose
    assistant marker is not the engine's ids."""
    rows, marker = len(encode(T2I_PREFIX)), tuple(encode(SUFFIX))
    if rows != SYSTEM_ROWS or marker != SUFFIX_IDS:
        raise ModelFileError(f"The {what} tokenizer gives the Krea 2 template's system turn {rows} tokens and its "
                             f"marker {list(marker)}; the engine's are {SYSTEM_ROWS} and {list(SUFFIX_IDS)}: use "
                             "the Qwen tokenizer of the snapshot.")
