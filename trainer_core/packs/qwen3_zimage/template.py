"""Z-Image's text contract (ggk 0.9.7 conditioner.hpp:3422-3442, llm.hpp:1779-1815; engine-adapter-families
§1.1): what the teacher, the student and the adapter see for a prompt.

* **Template.** The Qwen chat template (common/qwen_chat.py): `<|im_start|>user\\n` + the prompt's chunks after
  the engine's attention parse + `<|im_end|>\\n<|im_start|>assistant\\n`, each piece tokenized on its own. No
  system turn, no pads, no length cap; every row from position 0 goes to the DiT (start_idx 0), which pads the
  caption itself with its learned `cap_pad_token`.
* **Tap.** The target of a row is the teacher's `out_layers {35}` of Qwen3-4B's 36 layers ("-2"): the
  output of decoder layer 35 before any norm, HF `hidden_states[35]`, 2560 wide — the last layer but one
  of any depth (common/token_aligned_text.last_but_one).
* Text-to-image only: the engine's edit path for Z-Image (3426-3432) is not wired in 0.9.7.
"""
from __future__ import annotations

__all__ = ["N_LAYERS", "TAP"]

N_LAYERS = 36                   # Qwen3-4B
TAP = N_LAYERS - 1              # 35: hidden_states[-2]
