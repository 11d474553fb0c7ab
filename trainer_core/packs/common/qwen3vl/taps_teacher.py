"""A Qwen3-VL text stack read at several taps, stacked: the teacher of the layerwise families (FLUX.3 Klein's 8
taps, Krea 2's 12, and the FLUX.3 Klein bank of the Qwen3.5 bridge).

`TapsTeacher` loads the snapshot with transformers (Qwen3VLModel), keeps the text stack only and drops the
decoder layers past the deepest tap (their outputs are never read); the taps are the family's rule over the
model's depth (`taps_of(n_layers)`). A batch is the samples' template ids right-padded with <|endoftext|> to the
longest + 1; real rows at positions 0 … n−1 and pads at `pad_position` on every M-RoPE axis, pads masked as
keys, causal. Forward hooks on `layers[k−1]` collect hidden_states[k] for each tap k (the same tensors as
output_hidden_states); per sample the stacked rows of its n real tokens and of its first pad row come back:
with FLUX.3's pads (one position), every pad row of a sample is that same state; a family without pads drops it.

Placement as the other Qwen3-VL teachers (`precompute.teacher_mode`): the text stack on the card (`gpu`),
streamed from RAM layer by layer (`offload`, accelerate's cpu_offload), or on the CPU when there is no CUDA.
`MockTapsTeacher` gives deterministic rows of the same shapes with no file.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import torch

from trainer_core.base.errors import ModelFileError
from trainer_core.packs.common.snapshot_teacher import SnapshotTeacher
from trainer_core.packs.common.qwen3vl.teacher import check_rope, choose_mode, load_snapshot, resident_need_gib
from trainer_core.packs.common.qwen_chat import PAD_ID, padded_batch

# choose_mode and resident_need_gib: the placement rule TapsTeacher takes (TrainerPack.teacher_class)
__all__ = ["TapsTeacher", "MockTapsTeacher", "choose_mode", "resident_need_gib"]


class TapsTeacher(SnapshotTeacher):
    """The real teacher from a Qwen3-VL snapshot folder (see the module docstring): `taps_of` the family's taps
    of an n-layer stack, `family` how the load note names it, `pad_position` the pads' rope position."""

    placement = staticmethod(choose_mode)

    def __init__(self, root: str | os.PathLike, *, taps_of: Callable[[int], tuple[int, ...]], family: str,
                 pad_position: int | None = 1, **options: Any):
        self.taps_of, self.family, self.pad_position = taps_of, family, pad_position
        super().__init__(root, **options)     # device, mode, gpu_mem_gib, dtype: SnapshotTeacher's

    def _read(self) -> None:
        self.layer_dim, self.n_layers = self._config("Qwen3-VL", "the teacher", lambda c: (
            int(c.text_config.hidden_size), int(c.text_config.num_hidden_layers)))
        self.taps = self.taps_of(self.n_layers)
        self.out_dim = self.layer_dim * len(self.taps)

    def _load(self) -> None:
        self.tokenizer, model = load_snapshot(self.root, self.dtype)
        lm = getattr(model, "language_model", None)
        if lm is None or not hasattr(lm, "layers"):
            raise ModelFileError(f"{self.root} does not load as a Qwen3-VL model (no text stack); download "
                                 "Qwen/Qwen3-VL-4B-Instruct again.")
        del model                                  # the vision tower is never used
        lm.layers = lm.layers[:max(self.taps)]      # nor the layers past the deepest tap
        lm.eval().requires_grad_(False)
        check_rope(lm)
        table = lm.get_input_embeddings().weight
        if self.mode == "offload":             # the table stays a plain copy on the card
            self.embed = table.detach().to(self.device, copy=True)
        self._settle(lm, streamed=(lm,))
        if self.mode != "offload":
            self.embed = table.detach()
        self.model = lm

    def _summary(self) -> str:
        return (f"{self.family} teacher: {self.n_layers} layers of {self.layer_dim}, taps "
                f"{', '.join(map(str, self.taps))} ({self.out_dim} per row), {self.mode} on {self.device}")

    def hidden(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per sample, [n_real + 1, out_dim] float32 on the CPU: the stacked taps of its real rows and of
        its pad row; one padded batch."""
        ids, mask, positions = padded_batch(token_lists, pad_position=self.pad_position)
        dev = self.exec_device
        captured: dict[int, torch.Tensor] = {}

        def hook(k: int):
            def keep(module, args, out):
                captured[k] = out[0] if isinstance(out, tuple) else out
            return keep
        handles = [self.model.layers[k - 1].register_forward_hook(hook(k)) for k in self.taps]
        try:
            with torch.inference_mode():
                x = self.embed.to(dev)[ids.to(dev)].to(self.dtype)                              # [B, L, H]
                pos = positions.to(dev)[None].expand(3, -1, -1)                                 # [3, B, L]
                self.model(inputs_embeds=x, attention_mask=mask.long().to(dev), position_ids=pos, use_cache=False)
                stack = torch.cat([captured[k] for k in self.taps], dim=-1)                     # [B, L, taps·H]
        finally:
            for handle in handles:
                handle.remove()
        return [stack[b, :len(t) + 1].to("cpu", torch.float32) for b, t in enumerate(token_lists)]


class MockTapsTeacher:
    """Deterministic rows of the teacher's shapes: one-hot(id mod 64) times a fixed basis, with position/100
    added to column 1 of the real rows only, so the pad rows of a sample are identical."""

    mode = "mock"
    tokenizer = None

    def __init__(self, out_dim: int, taps: Sequence[int]):
        self.out_dim, self.taps = int(out_dim), tuple(taps)
        self.basis = torch.randn(64, self.out_dim, generator=torch.Generator().manual_seed(1234)) / 4

    def hidden(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        out = []
        for tokens in token_lists:
            ids = torch.tensor([*tokens, PAD_ID]) % 64
            x = torch.nn.functional.one_hot(ids, 64).float()
            x[:len(tokens), 1] += torch.arange(len(tokens)) / 100
            out.append((x @ self.basis).to(torch.bfloat16).float())
        return out
