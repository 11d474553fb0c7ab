"""The pack seam stays narrow and documented: `TrainerPack` has at most twenty public hooks, each listed in
`HOOKS` by stage, and no other public method; docs/ADDING_A_PACK.md's table lists exactly those hooks, in that
order, with their signatures (tests/test_layers.py: no pack folder imports another)."""
from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from trainer_core.packs import PACKS
from trainer_core.packs.base import HOOKS, TrainerPack

ROOT = Path(__file__).resolve().parent.parent


def _public_methods() -> dict[str, object]:
    fields = {f.name for f in dataclasses.fields(TrainerPack)}
    return {name: member for name, member in inspect.getmembers(TrainerPack)
            if not name.startswith("_") and name not in fields and (callable(member) or isinstance(member, property))}


def test_at_most_twenty_hooks_and_no_other_public_method():
    hooks = [name for stage in HOOKS.values() for name, _ in stage]
    assert len(hooks) <= 20 and len(set(hooks)) == len(hooks)
    assert sorted(_public_methods()) == sorted(hooks)


def test_the_guides_table_lists_the_hooks_by_stage_with_their_signatures():
    text = (ROOT / "docs" / "ADDING_A_PACK.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\w+) \| `(\w+)\(([^)]*)\)` \| ", text, re.MULTILINE)
    assert [(stage, name) for stage, name, _ in rows] == [(stage, name) for stage, hooks in HOOKS.items()
                                                          for name, _ in hooks]
    for _, name, args in rows:
        params = list(inspect.signature(getattr(TrainerPack, name)).parameters)[1:]
        assert [a.strip() for a in args.split(",") if a.strip()] == params, name


def test_every_discovered_pack_is_a_trainer_pack_with_a_corpus_kind_object():
    from trainer_core.contract.corpus_kinds import CorpusKind
    assert all(isinstance(p, TrainerPack) and isinstance(p.corpus_kind, CorpusKind) for p in PACKS.values())
