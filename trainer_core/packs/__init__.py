"""The pack registry, found without a list: every folder here with a `PACK` (a TrainerPack) in its
`__init__.py`, and every pack another distribution declares in the `gguf_trainer.packs` entry-point
group (`[project.entry-points."gguf_trainer.packs"] my_pack = "my_package.my_pack"`, the module or
the TrainerPack itself), so a pack can ship as its own pip package. `common/` holds what several packs
share and is not a pack. The GUI lists the packs by their `order`; the demos are those with a
`demo_order`, the first of which `python app.py --demo` and `gguf-trainer demo` build by default.
"""
from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points

from trainer_core.base.errors import UnknownPackError
from trainer_core.packs.base import TrainerPack

__all__ = ["PACKS", "DEFAULT_PACK", "DEMO_PACKS", "ENTRY_POINTS", "get_pack", "TrainerPack", "discover"]

ENTRY_POINTS = "gguf_trainer.packs"
_NOT_PACKS = {"base", "common"}


def _add(found: dict[str, TrainerPack], pack: TrainerPack, where: str) -> None:
    known = found.get(pack.id)
    if known is not None and known is not pack:
        raise ValueError(f"two trainer packs have the id {pack.id!r} (the second from {where}); rename one")
    found[pack.id] = pack


def discover() -> dict[str, TrainerPack]:
    """The packs of this folder and of the entry points, in the GUI's order."""
    found: dict[str, TrainerPack] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg and info.name not in _NOT_PACKS and not info.name.startswith("_"):
            pack = getattr(importlib.import_module(f"{__name__}.{info.name}"), "PACK", None)
            if isinstance(pack, TrainerPack):
                _add(found, pack, f"{__name__}.{info.name}")
    for point in entry_points(group=ENTRY_POINTS):
        loaded = point.load()
        pack = getattr(loaded, "PACK", loaded)
        if not isinstance(pack, TrainerPack):
            raise ValueError(f"the {ENTRY_POINTS} entry point {point.name} ({point.value}) is not a TrainerPack "
                             f"nor a module with one in PACK")
        _add(found, pack, f"the entry point {point.value}")
    return dict(sorted(found.items(), key=lambda item: (item[1].order, item[0])))


PACKS: dict[str, TrainerPack] = discover()
# the registry's default pack when a project.json names none: the reference project.json's
DEFAULT_PACK = "llada_image"
# the packs with a demo, in the order the GUI offers them; the first (a tiny real T5 teacher, the
# fastest run) is the demo `python app.py --demo` and `gguf-trainer demo` build by default
DEMO_PACKS: tuple[str, ...] = tuple(p.id for p in sorted(PACKS.values(), key=lambda p: p.demo_order) if p.demo_order)


def get_pack(pack_id: str) -> TrainerPack:
    try:
        return PACKS[pack_id]
    except (KeyError, TypeError):
        known = ", ".join(PACKS)
        guess = suggest_pack(pack_id) if isinstance(pack_id, str) else []
        mean = f"did you mean {' or '.join(guess)}? " if guess else ""
        raise UnknownPackError(
            f'There is no trainer pack "{pack_id}"; {mean}{"C" if mean else "c"}hoose one of: {known}.'
        ) from None


def suggest_pack(typed: str) -> list[str]:
    """The pack ids a mistyped id most likely meant: those whose id or title holds it ("pixart", "Krea 2"), else
    the closest ids and id tails by spelling ("t5xxl_pixar", "mageflo")."""
    import difflib
    import re
    key = re.sub(r"[^a-z0-9]", "", typed.lower())
    if not key:
        return []
    held = [pid for pid, pack in PACKS.items()
            if key in re.sub(r"[^a-z0-9]", "", pid) or key in re.sub(r"[^a-z0-9]", "", pack.title.lower())]
    if 0 < len(held) <= 3:
        return held
    tails = {pid.split("_", 1)[-1]: pid for pid in PACKS}
    close = difflib.get_close_matches(typed.lower(), [*PACKS, *tails], n=3, cutoff=0.6)
    return list(dict.fromkeys(tails.get(c, c) for c in close))
