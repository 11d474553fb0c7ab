"""Issue 38: the plan places the teacher where the teacher itself goes. For every pack whose teacher
`precompute.teacher_mode` places, on a grid of card budgets around what that teacher needs resident,
the plan's mode (plan.placement, the text the GUI and `gguf-trainer plan` show) equals the mode
the pack's teacher module takes on a CUDA device (`choose_mode`, what its constructor calls; no card is
needed: a set budget is not queried). For a pack placed by `precompute.placement`, the cards and budgets
the plan fills equal the max_memory the teacher hands accelerate."""
from __future__ import annotations

import importlib
import re

import pytest
import torch

import demo_cache
from trainer_core.contract.placement import card_budgets
from trainer_core.packs import DEMO_PACKS, PACKS
from trainer_core.plan import placement
from trainer_core.project import Project
from trainer_core.packs.lookup import resolve_material, teacher_module
from trainer_core.packs.estimates import teacher_need_gib

GIB = 2**30
CARD = {"index": 0, "name": "Test card", "memory_bytes": 96 * GIB}


def _hw(*totals_gib: float) -> dict:
    gpus = [{"index": i, "name": f"card {i}", "memory_bytes": int(t * GIB)} for i, t in enumerate(totals_gib)]
    return {"cpus": 2, "ram_available_bytes": 64 * GIB, "gpus": gpus or [CARD]}


MODE_PACKS = [p for p in DEMO_PACKS if PACKS[p].teacher_control == "teacher_mode"]
PLACEMENT_PACKS = [p for p in DEMO_PACKS if PACKS[p].teacher_control == "placement"]


def test_every_demo_pack_is_placed_by_one_of_the_two_rules():
    assert set(MODE_PACKS) | set(PLACEMENT_PACKS) == set(DEMO_PACKS) and MODE_PACKS and PLACEMENT_PACKS
    for pack_id in MODE_PACKS:
        module = importlib.import_module(teacher_module(PACKS[pack_id]))
        assert callable(module.choose_mode) and callable(module.resident_need_gib), pack_id


@pytest.mark.parametrize("pack_id", MODE_PACKS)
def test_the_plans_teacher_mode_is_the_teachers_own_on_a_grid_of_budgets(pack_id, tmp_path):
    project = Project.open(demo_cache.copy_built(pack_id, tmp_path))
    project.update_settings(["precompute.device=auto", "precompute.mock_teacher=false"])
    pack = project.pack
    root = resolve_material(project, "teacher")
    module = importlib.import_module(teacher_module(pack))
    need = teacher_need_gib(project)
    assert need == module.resident_need_gib(root) and need > 0
    # just under, at and just over the need, far under and far over; the budget is a setting (> 0)
    budgets = (0.25, need - 0.05, need, need + 0.05, need + 40.0)
    seen = set()
    for mode in ("auto", "gpu", "offload"):
        for budget in budgets:
            project.settings.precompute.teacher_mode = mode
            project.settings.precompute.gpu_mem_gib = budget
            text, _ = placement(project, _hw())
            planned = re.search(r"→ (gpu|offload):", text)
            assert planned, text
            own = module.choose_mode(root, mode, torch.device("cuda:0"), budget)
            assert planned.group(1) == own, (pack_id, mode, budget, need, text)
            seen.add(own)
    assert seen == {"gpu", "offload"}


@pytest.mark.parametrize("totals", [(80.0,), (80.0, 3.0), (80.0, 24.0), (24.0, 24.0, 3.6), (2.0, 48.0)])
@pytest.mark.parametrize("gpu_mem_gib", [0.0, 10.0])
@pytest.mark.parametrize("pack_id", PLACEMENT_PACKS)
def test_the_plans_cards_are_the_teachers_max_memory(pack_id, totals, gpu_mem_gib, tmp_path):
    module = importlib.import_module(teacher_module(PACKS[pack_id]))
    _, max_memory = module.placement_plan(torch.device("cuda:0"), "sequential", gpu_mem_gib, 8.0, totals)
    want = {k: v for k, v in max_memory.items() if k != "cpu"}
    assert want == {k: f"{v:.1f}GiB" for k, v in card_budgets(0, totals, gpu_mem_gib).items()}
    project = Project.open(demo_cache.copy_built(pack_id, tmp_path))
    p = project.settings.precompute
    p.mock_teacher, p.device, p.gpu_mem_gib, p.placement = False, "auto", gpu_mem_gib, "sequential"
    _, shares = placement(project, _hw(*totals))
    # the teacher's size hint (~33 GB) outgrows the smaller grids: every card with room gets a share, in order
    filled = [k for k, v in shares.items() if v]
    assert filled == list(want)[:len(filled)] and filled[0] == 0
    for index in filled[:-1]:
        assert f"{shares[index] / GIB:.1f}GiB" == want[index], (index, shares, want)
