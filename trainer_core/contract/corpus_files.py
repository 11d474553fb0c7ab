"""The text corpus file format (data/train.txt, data/val.txt): one prompt a line, an empty line
being the empty prompt. The corpus stage writes it; the packs and the shards read it."""
from __future__ import annotations

from pathlib import Path

from trainer_core.base.atomic import atomic_write_text

__all__ = ["read_corpus", "write_corpus"]


def read_corpus(path: Path) -> list[str]:
    """The prompts of a corpus file: one a line, an empty line being the empty prompt."""
    text = path.read_bytes().decode("utf-8")  # no universal newlines: only "\n" ends a prompt
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def write_corpus(path: Path, prompts: list[str]) -> None:
    """One prompt a line; line breaks inside a prompt become spaces."""
    atomic_write_text(path, "".join(_one_line(p) + "\n" for p in prompts))


def _one_line(prompt: str) -> str:
    return prompt.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
