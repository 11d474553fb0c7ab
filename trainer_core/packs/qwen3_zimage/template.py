"""Z-Image's text contract (ggk 0.9.7 conditioner.hpp:3422-3442, llm.hpp:1779-1815; engine-adapter-families
§1.1): what the teacher, the student and the adapter see for a prompt.

* **Template.** `<|im_start|>user\n` + the prompt's chunks after the engine's attention parse +
  `<|im_end|>\n<|im_start|>assistant\n`, each piece tokenized on its own — the FLUX.3 Klein pieces, so
  their ids and check are that pack's (qwen3vl_flux3/template.py). No system turn, no pads, no length
  cap; every row from position 0 goes to the DiT (start_idx 0), which pads the caption itself with its
  learned `cap_pad_token`.
* **Tap.** The target of a row is the teacher's `out_layers {35}` of Qwen3-4B's 36 layers ("-2"): the
  output of decoder layer 35 before any norm, HF `hidden_states[35]`, 2560 wide. `tap_for` takes the
  same place in any depth: the last layer but one.
* Text-to-image only: the engine's edit path for Z-Image (3426-3432) is not wired in 0.9.7.
"""
from __future__ import annotations

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.qwen3vl_flux3.template import (PAD_ID, PREFIX, PREFIX_IDS, SUFFIX, SUFFIX_IDS,
                                                       check_templates, fit_template)

__all__ = ["PREFIX", "SUFFIX", "PREFIX_IDS", "SUFFIX_IDS", "PAD_ID", "TAP", "N_LAYERS", "tap_for", "check_templates",
           "fit_template"]

N_LAYERS = 36                   # Qwen3-4B
TAP = N_LAYERS - 1              # 35: hidden_states[-2]


def tap_for(n_layers: int) -> int:
    """The tapped layer of a teacher with `n_layers` decoder layers: the last but one (35 of 36)."""
    if n_layers < 2:
        raise ModelFileError(f"The teacher has {n_layers} decoder layer; Z-Image reads hidden_states[-2], so it "
                             "needs at least 2 (Qwen3-4B has 36).")
    return n_layers - 1
