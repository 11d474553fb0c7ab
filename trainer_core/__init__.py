"""gguf-trainer: distil a diffusion model's text encoder into pig_clip + a small adapter.

Everything that is not UI lives in this package; it never imports gradio.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
