"""Issue 20: the pre-flight plan. Its calibrated figures against a real run of every demo pack on this
machine, and the warnings that name a fix."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli
from trainer_core import plan as plan_mod
from trainer_core.packs import DEMO_PACKS, get_pack
from trainer_core.plan import calibrate, make_plan
from trainer_core.project import Project


def _tree_bytes(*folders: Path) -> int:
    return sum(p.stat().st_size for f in folders for p in f.rglob("*") if p.is_file())


def _run_measured(root: Path) -> tuple[float, int]:
    """`gguf-trainer run`: (wall seconds, peak RSS of the largest process)."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core", "run", "--project", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read()[-2000:]
    return time.monotonic() - started, usage.ru_maxrss * 1024


# The calibration runs the same stage code for every pack; the default suite checks it on the text pack
# whose demo the other end-to-end tests also drive in fresh processes, and on the bridge pack (the kind
# whose parameter count includes its bank and heads, the largest plan); the others run with -m slow.
CALIBRATED = ("t5xxl_pixart", "qwen35_bridge")


@pytest.mark.parametrize("pack_id", [p if p in CALIBRATED else pytest.param(p, marks=pytest.mark.slow)
                                     for p in DEMO_PACKS])
def test_the_calibrated_plan_matches_the_run(tmp_path, pack_id):
    root = tmp_path / "projects" / get_pack(pack_id).default_folder
    assert cli("demo", "--project", str(root), "--pack", pack_id).returncode == 0
    project = Project.open(root)
    calibrate(project)
    planned = make_plan(project)
    assert planned["calibrated"] and all(s["seconds"] is not None for s in planned["stages"].values())
    assert not (root / ".calibration").exists()
    before = _tree_bytes(root.parent)
    wall, rss = _run_measured(root)
    written = _tree_bytes(root.parent) - before
    ratios = {"seconds": planned["total_seconds"] / wall, "bytes": planned["total_disk_bytes"] / written,
              "rss": planned["peak_ram_bytes"] / rss}
    print(f"PLAN {pack_id} " + json.dumps({"planned_s": planned["total_seconds"], "wall_s": round(wall, 1),
                                           "planned_bytes": planned["total_disk_bytes"], "written": written,
                                           "planned_rss": planned["peak_ram_bytes"], "peak_rss": rss,
                                           **{f"ratio_{k}": round(v, 2) for k, v in ratios.items()}}))
    assert 0.5 <= ratios["seconds"] <= 2.0, ratios
    assert 0.5 <= ratios["bytes"] <= 1.5, ratios
    assert 0.5 <= ratios["rss"] <= 2.0, ratios
    # the run kept the plan it started under, and status sets it beside what happened
    status = json.loads(cli("status", "--project", str(root), "--json").stdout)
    rows = {row["stage"]: row for row in status["plan"]}
    assert set(rows) == {"corpus", "precompute_val", "precompute_train", "train", "export", "eval"}
    assert all(row["actual_seconds"] is not None and row["planned_seconds"] is not None for row in rows.values())
    assert "planned vs actual: corpus" in cli("status", "--project", str(root)).stdout


def test_without_a_calibration_the_plan_is_a_rough_estimate_and_says_so(tmp_path):
    from trainer_core.plan_estimate import SOURCE
    root = tmp_path / "t5_adapter"
    assert cli("demo", "--project", str(root)).returncode == 0
    plan = make_plan(Project.open(root))
    assert not plan["calibrated"] and plan["total_seconds"] > 0
    assert all(st["source"] == SOURCE and "rough" in st["source"] for st in plan["stages"].values())
    assert plan["stages"]["precompute_train"]["disk_bytes"] > 0 and plan["stages"]["export"]["disk_bytes"] > 0
    assert plan["total_seconds"] == pytest.approx(sum(st["seconds"] for st in plan["stages"].values()), abs=0.5)
    r = cli("plan", "--project", str(root))
    assert r.returncode == 0 and "plan --calibrate measures this machine" in r.stdout and "rough estimate" in r.stdout
    shape = json.loads(cli("plan", "--project", str(root), "--json").stdout)
    assert set(shape) >= {"stages", "total_seconds", "total_disk_bytes", "peak_ram_bytes", "peak_vram_bytes",
                          "placement", "warnings"}
    assert set(shape["stages"]["train"]) == {"seconds", "disk_bytes", "peak_ram_bytes", "peak_vram_bytes", "source"}


def test_a_disk_too_small_gets_the_largest_corpus_that_fits(tmp_path, monkeypatch):
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    planned = make_plan(project, hw={"cpus": 2, "ram_available_bytes": 64 << 30, "gpus": []})
    shards = planned["stages"]["precompute_train"]["disk_bytes"] + planned["stages"]["precompute_val"]["disk_bytes"]
    other = planned["total_disk_bytes"] - shards
    free = other + shards // 4                             # a quarter of the shards fits
    monkeypatch.setattr(plan_mod, "free_bytes", lambda path: free)
    warned = make_plan(project, hw={"cpus": 2, "ram_available_bytes": 64 << 30, "gpus": []})["warnings"]
    n_train, n_val = project.settings.corpus.n_train, project.settings.corpus.n_val
    fit = int((free - other) / (shards / (n_train + n_val)) * n_train / (n_train + n_val))
    disk = [w for w in warned if w.startswith("Not enough disk")]
    assert len(disk) == 1 and f"about {fit} train samples (corpus.n_train={fit})" in disk[0]
    # 2 CPU cores and the recipe's 20k steps of a 1024-wide adapter: the plan also says how long
    day = [w for w in warned if w.startswith("Training takes")]
    assert len(day) == 1 and re.search(r"train\.steps=\d+ would take about a day", day[0])
    assert abs(fit - n_train / 4) <= 0.01 * n_train


def test_a_teacher_that_does_not_fit_the_card_gets_the_mode_that_would(tmp_path):
    project = Project.create(tmp_path / "p", "qwen3vl_mageflow")
    teacher = project.pack.resolve_material(project, "teacher")
    teacher.mkdir(parents=True)
    with open(teacher / "model-00001-of-00001.safetensors", "wb") as f:        # 9 GB, sparse: no disk used
        f.truncate(9 << 30)
    project.update_settings(["precompute.teacher_mode=gpu"])
    card = {"cpus": 16, "ram_available_bytes": 64 << 30,
            "gpus": [{"index": 0, "name": "RTX 4070", "memory_bytes": 12 << 30}]}
    warned = make_plan(Project.open(project.root), hw=card)["warnings"]
    assert any("teacher_mode=gpu needs ~12.0 GB" in w and "precompute.teacher_mode=offload" in w for w in warned)
    project.update_settings(["precompute.teacher_mode=offload"])
    assert not [w for w in make_plan(Project.open(project.root), hw=card)["warnings"] if w.startswith("The teacher")]
    small = {"cpus": 4, "ram_available_bytes": 6 << 30, "gpus": []}
    warned = make_plan(Project.open(project.root), hw=small)["warnings"]
    assert any(re.search(r"weights take ~9\.0 GB and 6\.0 GB of RAM", w) for w in warned)


def test_the_placement_follows_the_teachers_rules(tmp_path):
    """teacher_mode auto: resident when the card holds the weights + 3 GiB, else offloaded; LLaDA's
    sequential placement fills the chosen card, then the next, then RAM."""
    from trainer_core.plan_estimate import placement
    project = Project.create(tmp_path / "m", "qwen3vl_mageflow")
    teacher = project.pack.resolve_material(project, "teacher")
    teacher.mkdir(parents=True)
    with open(teacher / "model-00001-of-00001.safetensors", "wb") as f:
        f.truncate(8 << 30)
    big = {"cpus": 16, "ram_available_bytes": 64 << 30, "gpus": [{"index": 0, "name": "RTX 4090", "memory_bytes": 24 << 30}]}
    small = {**big, "gpus": [{"index": 0, "name": "RTX 4070", "memory_bytes": 12 << 30}]}
    text, vram = placement(Project.open(project.root), big)
    assert "→ gpu" in text and vram == {0: 8 << 30}
    text, vram = placement(Project.open(project.root), small)
    assert "→ offload" in text and vram[0] < 8 << 30
    llada = Project.create(tmp_path / "l", "llada_image")
    root = llada.pack.resolve_material(llada, "teacher")
    root.mkdir(parents=True)
    with open(root / "model.safetensors", "wb") as f:
        f.truncate(34 << 30)
    two = {**big, "gpus": [{"index": 0, "name": "RTX 4090", "memory_bytes": 24 << 30},
                           {"index": 1, "name": "RTX 3090", "memory_bytes": 24 << 30}]}
    text, vram = placement(Project.open(llada.root), two)
    assert vram == {0: int(22.5 * 2**30), 1: (34 << 30) - int(22.5 * 2**30)}        # 22.5 GiB, then 11.5 GiB
    assert "placement=sequential" in text and "in CPU RAM" not in text


def test_a_long_precompute_says_which_corpus_takes_a_day(tmp_path):
    project = Project.create(tmp_path / "p", "t5xxl_pixart")       # T5-XXL over 120k prompts on 64 CPU cores
    plan = make_plan(project, hw={"cpus": 64, "ram_available_bytes": 64 << 30, "gpus": []})
    train_s, val_s = (plan["stages"][f"precompute_{s}"]["seconds"] for s in ("train", "val"))
    n_train = project.settings.corpus.n_train
    fit = int((plan_mod.LONG_TRAIN_S - val_s) / (train_s / n_train))
    said = [w for w in plan["warnings"] if w.startswith("Precompute takes")]
    assert train_s + val_s > plan_mod.LONG_TRAIN_S > val_s and 0 < fit < n_train
    assert len(said) == 1 and f"a corpus of about {fit} (corpus.n_train={fit}) would take a day" in said[0]


def test_a_calibration_whose_stage_fails_says_why_and_keeps_its_log(tmp_path):
    from trainer_core.base.errors import TrainerError
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    project.update_settings(["corpus.presets=[]"])                  # nothing to read: the corpus stage fails
    with pytest.raises(TrainerError) as e:
        calibrate(Project.open(project.root))
    log = project.root / ".calibration" / "pipeline.log"
    assert "calibration's corpus stage failed" in str(e.value) and str(log) in str(e.value)
    assert log.is_file() and "corpus" in log.read_text()
    assert not (project.root / plan_mod.CALIBRATION_FILE).exists()
