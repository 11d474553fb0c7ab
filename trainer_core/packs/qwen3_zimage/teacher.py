"""The Z-Image teacher: Qwen3-4B (`Qwen3Model`) read at hidden_states[35], before any norm.

`Qwen3Teacher` loads the snapshot with transformers, drops the decoder layers past the tap (their output is
never read) and collects the tapped layer's output with a forward hook. A batch is the samples' template ids
right-padded with <|endoftext|>, masked as keys on top of the causal mask, at positions 0 … L−1: no real row
attends to a pad, so a real row is that of the prompt run alone (what the engine runs, one prompt, no pads).
Placement as the other Qwen teachers (`precompute.teacher_mode`, contract/placement.py): resident on the
card (`gpu`), streamed from RAM layer by layer (`offload`), or the CPU without CUDA.
`MockZImageTeacher` gives deterministic rows of the same shape with no file.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.batching import pad_batch
from trainer_core.packs.common.mock_teachers import MockTokenTeacher, mock_tokenizer
# choose_mode and resident_need_gib: the Qwen teachers' rule (the weights + 3 GiB), which Qwen3Teacher takes
from trainer_core.packs.common.qwen3vl.teacher import check_rope, choose_mode, resident_need_gib
from trainer_core.packs.common.snapshot_teacher import SnapshotTeacher
from trainer_core.packs.qwen3_zimage.template import PAD_ID, tap_for

__all__ = ["Qwen3Teacher", "MockZImageTeacher", "choose_mode", "resident_need_gib", "REPO"]

REPO = "Qwen/Qwen3-4B"


class Qwen3Teacher(SnapshotTeacher):
    """The real teacher from a Qwen3 snapshot folder (see the module docstring)."""

    placement = staticmethod(choose_mode)

    def _read(self) -> None:
        config, self.out_dim, self.n_layers = self._config("Qwen3", REPO, lambda c: (
            c, int(c.hidden_size), int(c.num_hidden_layers)))
        if getattr(config, "model_type", "") != "qwen3":
            raise ModelFileError(f"{self.root} holds a {getattr(config, 'model_type', '?')} model, not Qwen3; "
                                 f"download {REPO} again.")
        self.tap = tap_for(self.n_layers)

    def _load(self) -> None:
        from transformers import AutoModel
        self.tokenizer = mock_tokenizer(self.root / "tokenizer.json", "teacher", REPO)
        try:
            model = AutoModel.from_pretrained(self.root, dtype=self.dtype)
        except (OSError, ValueError, KeyError) as e:
            raise ModelFileError(f"The Qwen3 teacher in {self.root} cannot be loaded ({type(e).__name__}: {e}); "
                                 f"download {REPO} again.") from None
        model.layers = model.layers[:self.tap]             # the layers past the tap are never read
        model.eval().requires_grad_(False)
        check_rope(model)
        self._settle(model, resident=(model.embed_tokens, model.norm, model.rotary_emb), streamed=model.layers)
        self.model = model

    def _summary(self) -> str:
        return (f"Z-Image teacher: Qwen3 {self.n_layers} layers of {self.out_dim}, hidden_states[{self.tap}] "
                f"(pre-norm), {self.mode} on {self.device}")

    def hidden(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per sample, its rows [len, out_dim] float32 on the CPU; one padded batch."""
        ids, mask = pad_batch(token_lists, PAD_ID)
        dev = self.exec_device
        captured: list[Any] = []
        handle = self.model.layers[self.tap - 1].register_forward_hook(
            lambda module, args, out: captured.append(out[0] if isinstance(out, tuple) else out))
        try:
            with torch.inference_mode():
                self.model(input_ids=ids.to(dev), attention_mask=mask.long().to(dev), use_cache=False)
        finally:
            handle.remove()
        return [captured[0][b, :len(t)].to("cpu", torch.float32) for b, t in enumerate(token_lists)]


class MockZImageTeacher(MockTokenTeacher):
    """The token-aligned mock (common/mock_teachers.py): one row per template token, a causal running mix."""

    tokenizer = None

    def hidden(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        return self.forward_tokens([list(t) for t in token_lists])
