"""Small but real pig_clip student GGUFs (packs/common/tiny_models.py: a random Qwen3 in the pig_clip layout, with
a 512-token vocabulary so the files stay ~0.1-0.2 MB) as bytes, built once per process, for a stand-in Hub to
serve."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

__all__ = ["student_gguf_bytes"]


@functools.lru_cache(maxsize=None)
def student_gguf_bytes(dtype: str = "f16") -> bytes:
    import torch
    from transformers import Qwen3Model

    from trainer_core.packs.common.tiny_models import tiny_qwen3_config, write_student_gguf
    torch.manual_seed(0)
    model = Qwen3Model(tiny_qwen3_config(vocab_size=512))
    with tempfile.TemporaryDirectory() as folder:
        return write_student_gguf(model, Path(folder) / f"pig_clip-{dtype}.gguf", dtype=dtype).read_bytes()
