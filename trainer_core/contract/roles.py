"""What a pack hands the stages, as the stages see it: typing protocols the packs' models satisfy by shape.

* `Teacher`: what `TrainerPack.build_teacher` / `build_mock_teacher` return. The precompute stage reads
  `out_dim` and, where a real teacher has them, `mode` (the placement it took, contract/placement.py) and
  `notes` (what loading had to decide or repair, logged line by line); everything else about a teacher is
  its pack's own, handed back unread to the pack's `prepare` and `make_shard`.
* `Student`: the loaded pig_clip (contract/student.Student) every pack's `make_shard` encodes with.

Importable without torch (the GUI and the plan import the pack hooks' annotations).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["Teacher", "Student"]


@runtime_checkable
class Teacher(Protocol):
    out_dim: int                      # the width of the target rows it returns


@runtime_checkable
class Student(Protocol):
    hidden_size: int
    config: Any                       # the transformers Qwen3Config it was built from

    @property
    def device(self) -> "torch.device": ...

    def tokenize(self, text: str) -> list[int]: ...

    def ids(self, chunks: list[str]) -> list[int]: ...

    def batch(self, token_lists: list[list[int]]) -> "tuple[torch.Tensor, torch.Tensor]": ...

    def hidden(self, ids: "torch.Tensor", mask: "torch.Tensor", position_ids: "torch.Tensor | None" = None
               ) -> "torch.Tensor": ...
