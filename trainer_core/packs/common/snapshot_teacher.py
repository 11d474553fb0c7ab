"""The part every real multimodal teacher shares: a snapshot folder, a device, the placement the pack's
own rule picks (`precompute.teacher_mode`), the compute dtype, and a note of what was loaded.

A subclass names its placement rule (`placement = staticmethod(choose_mode)`, the same function the plan
asks through `TrainerPack.teacher_need_gib`) and fills three steps, run in this order:

* `_read()`   reads what it needs before placement (config widths; refuses a wrong snapshot),
* `_load()`   loads the weights and puts them where `self.mode` says (`_settle` does the common moves),
* `_summary()` the one line the precompute log shows.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, TypeVar

import torch

from trainer_core.base.errors import ModelFileError

__all__ = ["SnapshotTeacher"]

T = TypeVar("T")


class SnapshotTeacher:
    """A real teacher from a snapshot folder (see the module docstring)."""

    placement: ClassVar[Callable[[Path, str, torch.device, float], str]]

    def __init__(self, root: str | os.PathLike, device: str | torch.device = "cpu", mode: str = "auto",
                 gpu_mem_gib: float = 0.0, dtype: torch.dtype | None = None,
                 log: Callable[[str], None] | None = None):
        self.root, self.device = Path(root), torch.device(device)
        self.notes: list[str] = []
        self._read()
        self.mode = type(self).placement(self.root, mode, self.device, gpu_mem_gib)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self._load()
        (log or self.notes.append)(self._summary())

    def _read(self) -> None:
        """Read the snapshot's config before placement (ModelFileError naming the file when it is wrong)."""

    def _load(self) -> None:
        raise NotImplementedError

    def _summary(self) -> str:
        raise NotImplementedError

    def _config(self, what: str, repo: str, read: Callable[[Any], T]) -> T:
        """`read` of the snapshot's transformers config (AutoConfig), or ModelFileError naming the folder and the
        repo to download again when the config or a field `read` takes is missing or malformed."""
        from transformers import AutoConfig
        try:
            return read(AutoConfig.from_pretrained(self.root))
        except (OSError, ValueError, AttributeError, TypeError, KeyError) as e:
            raise ModelFileError(f"The {what} config in {self.root} cannot be read ({e}); download {repo} "
                                 "again.") from None

    @property
    def exec_device(self) -> torch.device:
        """Where the teacher computes: the card unless it runs on the CPU."""
        return self.device if self.mode != "cpu" else torch.device("cpu")

    def _settle(self, whole: torch.nn.Module | None, resident: Iterable[torch.nn.Module] = (),
                streamed: Iterable[torch.nn.Module] = ()) -> None:
        """Put the loaded model where `self.mode` says. offload: the `resident` parts onto the card and each
        `streamed` part computed there from RAM (accelerate's cpu_offload); gpu / cpu: `whole` moved there
        (None: it was loaded in place); on the CPU the teacher takes every core."""
        if self.mode == "offload":
            from accelerate import cpu_offload
            for part in resident:
                part.to(self.device)
            for part in streamed:
                cpu_offload(part, execution_device=self.device)
            return
        if whole is not None:
            whole.to(self.device if self.mode == "gpu" else "cpu")
        if self.mode == "cpu":
            torch.set_num_threads(os.cpu_count() or 1)
