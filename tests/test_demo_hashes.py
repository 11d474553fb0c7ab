"""Behaviour kept across refactors: every demo pack, taken through the whole pipeline by the stage
processes as the driver starts them (tests/demo_cache.py), exports the same GGUF, the same extra files and the same eval.json
(clock and path fields left out) as `gguf-trainer run` did in fresh processes when the figures in
tests/data/demo_hashes.json were recorded by bench/demo_hashes.py on this kind of machine (both fingerprint with
tests/demo_fingerprint.py).

Float results depend on the CPU's vector width and the torch build; on another machine the recorded
figures do not apply, and the test checks instead that exporting and evaluating the same checkpoint
again writes the same bytes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import demo_cache
from demo_fingerprint import fingerprint
from trainer_core.packs import DEMO_PACKS
from trainer_core.project import Project

DATA = Path(__file__).parent / "data" / "demo_hashes.json"
RECORDED = json.loads(DATA.read_text())
SAME_MACHINE = (RECORDED["capability"] == torch.backends.cpu.get_cpu_capability()
                and RECORDED["torch"] == torch.__version__)


def test_the_recorded_figures_are_of_the_runs_the_tests_share():
    assert RECORDED["settings"] == list(demo_cache.SETTINGS)
    assert set(RECORDED["packs"]) == set(DEMO_PACKS)


@pytest.mark.parametrize("pack_id", DEMO_PACKS)
def test_the_stage_chain_exports_the_recorded_bytes(pack_id, tmp_path):
    root = demo_cache.copy_trained(pack_id, tmp_path)
    got = fingerprint(root)
    assert got["extras"].keys() == RECORDED["packs"][pack_id]["extras"].keys()
    if SAME_MACHINE:
        want = {k: RECORDED["packs"][pack_id][k] for k in ("gguf", "extras", "eval")}
        assert got == want, f"{pack_id}: the export or eval.json changed from the recorded run"
        return
    # another CPU or torch: the recorded bytes do not apply; the same checkpoint must export the same bytes
    from trainer_core.base.events import ListReport
    from trainer_core.stages import evaluate, export
    project = Project.open(root)
    assert export.run(project, ListReport(), lambda: False) == "done"
    assert evaluate.run(Project.open(root), ListReport(), lambda: False) == "done"
    assert fingerprint(root) == got
