"""The Krea 2 teacher: Qwen3-VL-4B-Instruct's text stack with 12 intermediate layers stacked.

It is the FLUX.3 Klein teacher (qwen3vl_flux3/teacher.py: the text stack only, the layers past the deepest
tap dropped, forward hooks collecting hidden_states[k], placement by `precompute.teacher_mode`) with the
Krea 2 taps 2, 5, …, 35. Its batch pads every sample with at least one <|endoftext|> masked as a key, which
no real row attends to, so the real rows are those of the unpadded template the engine runs; the one pad
row per sample it also returns is what the Klein shard stores, and the Krea 2 shard drops it. The mock is
the Klein mock with these taps.
"""
from __future__ import annotations

from trainer_core.packs.qwen3vl_flux3.teacher import KleinTeacher, choose_mode, resident_need_gib
from trainer_core.packs.qwen3vl_krea2.template import taps_for

# choose_mode and resident_need_gib: the placement rule Krea2Teacher takes (TrainerPack.teacher_class)
__all__ = ["Krea2Teacher", "choose_mode", "resident_need_gib"]


class Krea2Teacher(KleinTeacher):
    """The real teacher from a Qwen3-VL snapshot folder (see the module docstring)."""

    def _read(self) -> None:
        super()._read()
        self.taps = taps_for(self.n_layers)
        self.out_dim = self.layer_dim * len(self.taps)

    def _summary(self) -> str:
        return (f"Krea 2 teacher: {self.n_layers} layers of {self.layer_dim}, taps {', '.join(map(str, self.taps))} "
                f"({self.out_dim} per row), {self.mode} on {self.device}")
