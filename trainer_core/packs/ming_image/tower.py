"""Ming's own vision tower as the engine check builds and reads it (EngineFacts.vision_tower): the demo's tiny
snapshot writer, the tower's loader, the `--llm_vision` GGUF export, how precompute reads a reference and the
patches the tower takes. Loaded only by bench/'s engine check and the tests (torch)."""
from __future__ import annotations

from trainer_core.packs.ming_image.export import export_vision_gguf as export
from trainer_core.packs.ming_image.template import patchify
from trainer_core.packs.ming_image.template import preprocess_image as read_reference
from trainer_core.packs.ming_image.tiny import write_tiny_ming as write_tiny
from trainer_core.packs.ming_image.vision import MingVision

__all__ = ["write_tiny", "load_tower", "export", "read_reference", "patchify"]

load_tower = MingVision.load
