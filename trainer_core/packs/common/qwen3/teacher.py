"""A Qwen3 text teacher (`Qwen3Model`, a `Qwen3ForCausalLM` checkpoint read as its base model) at the family's
taps, before any norm: Z-Image's hidden_states[35] of Qwen3-4B, and any family that taps a plain Qwen3.

`Qwen3Teacher` loads the snapshot with transformers, drops the decoder layers past the deepest tap (their output
is never read) and collects each tapped layer's output with a forward hook, stacked in tap order (one tap: that
layer's rows). A batch is the samples' template ids right-padded with <|endoftext|>, masked as keys on top of
the causal mask, at positions 0 … L−1: no real row attends to a pad, so a real row is that of the prompt run
alone (what the engine runs, one prompt, no pads). Placement as the other Qwen teachers
(`precompute.teacher_mode`, contract/placement.py): resident on the card (`gpu`), streamed from RAM layer by
layer (`offload`), or the CPU without CUDA. `MockQwen3Teacher` gives deterministic rows of the same shape with
no file.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import torch

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.batching import pad_batch
from trainer_core.packs.common.mock_teachers import MockTokenTeacher, mock_tokenizer
# choose_mode and resident_need_gib: the Qwen teachers' rule (the weights + 3 GiB), which Qwen3Teacher takes
from trainer_core.packs.common.qwen3vl.teacher import check_rope, choose_mode, resident_need_gib
from trainer_core.packs.common.snapshot_teacher import SnapshotTeacher
from trainer_core.packs.common.qwen_chat import PAD_ID

__all__ = ["Qwen3Teacher", "MockQwen3Teacher", "choose_mode", "resident_need_gib"]


class Qwen3Teacher(SnapshotTeacher):
    """The real teacher from a Qwen3 snapshot folder (see the module docstring): `taps_of` the family's taps of an
    n-layer model, `family` how the load note names it, `repo` what to download again when the files are wrong."""

    placement = staticmethod(choose_mode)

    def __init__(self, root: str | os.PathLike, *, taps_of: Callable[[int], tuple[int, ...]], family: str,
                 repo: str, **options: Any):
        self.taps_of, self.family, self.repo = taps_of, family, repo
        super().__init__(root, **options)     # device, mode, gpu_mem_gib, dtype: SnapshotTeacher's

    def _read(self) -> None:
        config, self.layer_dim, self.n_layers = self._config("Qwen3", self.repo, lambda c: (
            c, int(c.hidden_size), int(c.num_hidden_layers)))
        if getattr(config, "model_type", "") != "qwen3":
            raise ModelFileError(f"{self.root} holds a {getattr(config, 'model_type', '?')} model, not Qwen3; "
                                 f"download {self.repo} again.")
        self.taps = self.taps_of(self.n_layers)
        self.out_dim = self.layer_dim * len(self.taps)

    def _load(self) -> None:
        from transformers import AutoModel
        self.tokenizer = mock_tokenizer(self.root / "tokenizer.json", "teacher", self.repo)
        try:
            model = AutoModel.from_pretrained(self.root, dtype=self.dtype)
        except (OSError, ValueError, KeyError) as e:
            raise ModelFileError(f"The Qwen3 teacher in {self.root} cannot be loaded ({type(e).__name__}: {e}); "
                                 f"download {self.repo} again.") from None
        model.layers = model.layers[:max(self.taps)]       # the layers past the deepest tap are never read
        model.eval().requires_grad_(False)
        check_rope(model)
        self._settle(model, resident=(model.embed_tokens, model.norm, model.rotary_emb), streamed=model.layers)
        self.model = model

    def _summary(self) -> str:
        taps = ", ".join(map(str, self.taps))
        return (f"{self.family} teacher: Qwen3 {self.n_layers} layers of {self.layer_dim}, hidden_states[{taps}] "
                f"(pre-norm), {self.mode} on {self.device}")

    def hidden(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per sample, its rows [len, out_dim] float32 on the CPU; one padded batch."""
        ids, mask = pad_batch(token_lists, PAD_ID)
        dev = self.exec_device
        captured: dict[int, Any] = {}

        def hook(k: int) -> Callable[..., None]:
            def keep(module: Any, args: Any, out: Any) -> None:
                captured[k] = out[0] if isinstance(out, tuple) else out
            return keep
        handles = [self.model.layers[k - 1].register_forward_hook(hook(k)) for k in self.taps]
        try:
            with torch.inference_mode():
                self.model(input_ids=ids.to(dev), attention_mask=mask.long().to(dev), use_cache=False)
                stack = (captured[self.taps[0]] if len(self.taps) == 1 else
                         torch.cat([captured[k] for k in self.taps], dim=-1))                    # [B, L, taps·H]
        finally:
            for handle in handles:
                handle.remove()
        return [stack[b, :len(t)].to("cpu", torch.float32) for b, t in enumerate(token_lists)]


class MockQwen3Teacher(MockTokenTeacher):
    """The token-aligned mock (common/mock_teachers.py): one row per template token, a causal running mix."""

    tokenizer = None

    def hidden(self, token_lists: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        return self.forward_tokens([list(t) for t in token_lists])
