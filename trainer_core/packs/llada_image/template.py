"""LLaDA-Image-Turbo's side of the engine contract: the template, the reference shapes."""
from __future__ import annotations

__all__ = ["NUM_QUERIES", "OUT_DIM", "MAX_LEN_TEACHER", "PREFIX", "SUFFIX", "TEMPLATE", "EMPTY"]

# the reference shapes: 256 QueryFormer rows of the 2560-wide text_projection output
NUM_QUERIES, OUT_DIM = 256, 2560
MAX_LEN_TEACHER = 2048     # teacher tokens kept per prompt

# the engine encodes PREFIX, " " + the text (attention-parsed) and SUFFIX separately; an empty
# prompt is the one-chunk EMPTY form
PREFIX, SUFFIX = "<role>HUMAN</role> Generate an image:", "\n<role>ASSISTANT</role>\n<IMAGE1>"
TEMPLATE = PREFIX + " {text}" + SUFFIX
EMPTY = "<role>HUMAN</role> Generate an image.\n<role>ASSISTANT</role>\n<IMAGE1>"  # a period, no ": "
