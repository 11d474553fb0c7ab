"""Python's cyclic garbage collector in a stage process: paused while it imports and loads, then that frozen.

A stage process imports torch, and its models bring transformers' model code (torch._dynamo,
torch.distributed.tensor, sympy): a few million objects that live until the process exits, and every full
collection that the importing and loading triggers walks all of them again. Counted with gc.callbacks on the
PixArt demo, each stage process spent 0.6 CPU-s of its 4.5–5.9 in six full collections, and 0.15 in young ones.

So a `python -m trainer_core.stages.X` process pauses the collector before its first import
(`pause_for_imports`, called by trainer_core/stages/__init__.py while Python locates the module), freezes what
is alive once stage_main starts (`settle`: gc.freeze moves those objects to a generation no collection walks)
and collects as usual again; the stages load their models inside `loading()`, which does the same around the
load. Nothing is freed later than reference counting frees it: only cycles among what was imported or loaded,
which lives as long as the process, are never looked at. Every other process (the CLI, the GUI, a stage run
in-process by a test) is left alone.
"""
from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["pause_for_imports", "settle", "loading"]

_stage_process = False


def pause_for_imports() -> None:
    """In a `python -m` process that is locating a trainer_core.stages module (sys.argv[0] is "-m" until the
    module is found, as the Python documentation says of -m): stop collecting until `settle`."""
    global _stage_process
    if sys.argv[:1] == ["-m"] and gc.isenabled():
        _stage_process = True
        gc.disable()


def settle() -> None:
    """The imports are done: freeze what they made and collect as usual again."""
    if _stage_process and not gc.isenabled():
        gc.freeze()
        gc.enable()


@contextmanager
def loading() -> Iterator[None]:
    """A stage process loads its models (and the code they import) with the collector paused, then freezes them."""
    if not (_stage_process and gc.isenabled()):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
