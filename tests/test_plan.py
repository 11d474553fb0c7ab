"""Issue 20: the pre-flight plan. Its calibrated figures against a real run of every demo pack on this
machine, the default plan (no calibration) against the session's demo runs (issue 40), and the warnings that
name a fix."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import demo_cache
from conftest import cli
from trainer_core.base.procs import run_delays, wait_usage
from trainer_core.packs import DEMO_PACKS
from trainer_core.plan import CALIBRATION_FILE, advice, calibrate, make_plan
from trainer_core.project import Project
from trainer_core.packs.lookup import resolve_material
from plan_bounds import idle_seconds, within_bounds


def _tree_bytes(*folders: Path) -> int:
    return sum(p.stat().st_size for f in folders for p in f.rglob("*") if p.is_file())


class _StageQueues(threading.Thread):
    """How long the processes under `pid` sat ready to run without a core, read every 20 ms (the family found
    every 0.25 s) until `done` is set (procs.run_delays; a thread keeps its last reading once it has exited):
    every thread's of the family, and the main threads' of the stage processes (their command line names
    trainer_core.stages), which run one at a time. Their idle seconds (test_the_default_plan_matches_the_demo_run
    says why): at least the wall less every thread's wait and the family's CPU seconds over the cores, at most the
    wall less the stage processes' main threads' wait."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.done, self.started = pid, threading.Event(), time.monotonic()
        self.waits: dict[tuple[int, int], float] = {}
        self.stages: dict[int, bool] = {}

    def run(self) -> None:
        family, next_scan = [self.pid], 0.0
        while not self.done.wait(0.02):
            if time.monotonic() >= next_scan:        # a scan reads every process's stat: every 0.25 s (procs)
                try:
                    family = [self.pid, *(c.pid for c in psutil.Process(self.pid).children(recursive=True))]
                except psutil.Error:
                    continue
                next_scan = time.monotonic() + 0.25
            for pid in family:
                if pid not in self.stages:
                    try:
                        self.stages[pid] = any("trainer_core.stages" in a for a in psutil.Process(pid).cmdline())
                    except psutil.Error:
                        continue
                for tid, seconds in run_delays(pid).items():
                    self.waits[(pid, tid)] = max(self.waits.get((pid, tid), 0.0), seconds)

    def idle_seconds(self, cpu_seconds: float | None) -> tuple[float, float, float]:
        """(at least, at most, the wall) since the watch started; `cpu_seconds` the family's."""
        wall = time.monotonic() - self.started
        most = wall - sum(s for (pid, tid), s in self.waits.items() if pid == tid and self.stages.get(pid))
        least = max(wall - sum(self.waits.values()), (cpu_seconds or 0.0) / (os.cpu_count() or 1))
        return min(least, most), most, wall


def _watched(proc: subprocess.Popen, runs: list[tuple[float, float, float]]) -> int:
    """What wait_peak_rss(proc) returns (this stands in for it in the calibration), the idle seconds of `proc` and
    its family appended to `runs` (_StageQueues)."""
    watch = _StageQueues(proc.pid)
    watch.start()
    cpu = None
    try:
        usage = wait_usage(proc)
        cpu = usage.cpu_seconds
        return usage.peak_rss_bytes
    finally:
        watch.done.set()
        watch.join()
        runs.append(watch.idle_seconds(cpu))


def _calibrated(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, tuple[float, float]]:
    """The calibrated plan of the project at `root`, and the share of its seconds the calibration would have taken
    on an idle machine: (at least, at most) of its driver runs' idle seconds over their wall. A loaded machine
    stretches what the calibration measures, and so the plan, by about that much."""
    from trainer_core.plan import calibration
    runs: list[tuple[float, float, float]] = []
    monkeypatch.setattr(calibration, "wait_peak_rss", lambda proc: _watched(proc, runs))
    calibrate(Project.open(root))
    wall = sum(r[2] for r in runs)
    return make_plan(Project.open(root)), (sum(r[0] for r in runs) / wall, sum(r[1] for r in runs) / wall)


def _run_measured(root: Path) -> tuple[tuple[float, float], int]:
    """`gguf-trainer run`: ((at least, at most) its idle seconds (_StageQueues), peak RSS of the largest process)."""
    runs: list[tuple[float, float, float]] = []
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core", "run", "--project", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = _watched(proc, runs)
    assert proc.returncode == 0, proc.stderr.read()[-2000:]
    return runs[0][:2], peak


# The calibration runs the same stage code for every pack; the default suite checks it on the text pack
# and on the bridge pack (the kind whose parameter count includes its bank and heads, the largest plan),
# the others with -m slow. The run it is held to is the session's demo run (tests/demo_cache.py: the stage
# processes as the driver starts them, on the same settings).
CALIBRATED = ("t5xxl_pixart", "qwen35_bridge")


@pytest.mark.parametrize("pack_id", [p if p in CALIBRATED else pytest.param(p, marks=pytest.mark.slow)
                                     for p in DEMO_PACKS])
def test_the_calibrated_plan_matches_the_run(tmp_path, monkeypatch, pack_id):
    """The calibration measures wall time, so on a loaded machine its plan is long by about the load's stretch
    of the calibration; both it and the run are held to what they would take idle (plan_bounds.within_bounds)."""
    root = demo_cache.copy_built(pack_id, tmp_path)
    planned, share = _calibrated(root, monkeypatch)
    assert planned["calibrated"] and all(s["seconds"] is not None for s in planned["stages"].values())
    assert not (root / ".calibration").exists()
    ran = demo_cache.run_figures(pack_id)
    within_bounds(pack_id, "CALIBRATED PLAN", planned, idle_seconds(ran), ran["written_bytes"],
                   ran["peak_rss_bytes"], share, wall_s=ran["seconds"])


def test_a_run_keeps_its_calibrated_plan_and_status_sets_it_beside_what_happened(tmp_path, monkeypatch):
    root = demo_cache.copy_built("qwen3_zimage", tmp_path)       # the quickest demo
    planned, share = _calibrated(root, monkeypatch)
    before = _tree_bytes(root.parent)
    seconds, rss = _run_measured(root)
    within_bounds("qwen3_zimage", "CALIBRATED PLAN, run by the driver", planned, seconds,
                   _tree_bytes(root.parent) - before, rss, share)
    status = json.loads(cli("status", "--project", str(root), "--json").stdout)
    rows = {row["stage"]: row for row in status["plan"]}
    assert set(rows) == {"corpus", "precompute_val", "precompute_train", "train", "export", "eval"}
    assert all(row["actual_seconds"] is not None and row["planned_seconds"] is not None for row in rows.values())
    assert "planned vs actual: corpus" in cli("status", "--project", str(root)).stdout


def test_without_a_calibration_the_plan_is_a_rough_estimate_and_says_so(tmp_path):
    from trainer_core.plan.estimate import SOURCE
    root = demo_cache.copy_built("t5xxl_pixart", tmp_path)
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
    monkeypatch.setattr(advice, "free_bytes", lambda path: free)
    warned = make_plan(project, hw={"cpus": 2, "ram_available_bytes": 64 << 30, "gpus": []})["warnings"]
    n_train, n_val = project.settings.corpus.n_train, project.settings.corpus.n_val
    fit = int((free - other) / (shards / (n_train + n_val)) - n_val)      # beside the val split as it is
    disk = [w for w in warned if w.startswith("Not enough disk")]
    assert len(disk) == 1 and f"about {fit} train samples (corpus.n_train={fit}) fits" in disk[0]
    # 2 CPU cores and the recipe's 20k steps of a 1024-wide adapter: the plan also says how long
    day = [w for w in warned if w.startswith("Training takes")]
    assert len(day) == 1 and re.search(r"train\.steps=\d+ would take about a day", day[0])
    # set as named, the run fits; 1 % more would not (the corpus files, counted apart, leave a little slack)
    for n, fits in ((fit, True), (int(fit * 1.01), False)):
        project.update_settings([f"corpus.n_train={n}"])
        again = make_plan(Project.open(project.root), hw={"cpus": 2, "ram_available_bytes": 64 << 30, "gpus": []})
        assert (again["total_disk_bytes"] <= free) == fits
        assert bool([w for w in again["warnings"] if w.startswith("Not enough")]) != fits


def test_a_teacher_that_does_not_fit_the_card_gets_the_mode_that_would(tmp_path):
    project = Project.create(tmp_path / "p", "qwen3vl_mageflow")
    teacher = resolve_material(project, "teacher")
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
    from trainer_core.plan import placement
    project = Project.create(tmp_path / "m", "qwen3vl_mageflow")
    teacher = resolve_material(project, "teacher")
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
    root = resolve_material(llada, "teacher")
    root.mkdir(parents=True)
    with open(root / "model.safetensors", "wb") as f:
        f.truncate(34 << 30)
    two = {**big, "gpus": [{"index": 0, "name": "RTX 4090", "memory_bytes": 24 << 30},
                           {"index": 1, "name": "RTX 3090", "memory_bytes": 24 << 30}]}
    text, vram = placement(Project.open(llada.root), two)
    assert vram == {0: int(22.5 * 2**30), 1: (34 << 30) - int(22.5 * 2**30)}        # 22.5 GiB, then 11.5 GiB
    assert "placement=sequential" in text and "in CPU RAM" not in text


def _precompute_warning(project: Project, hw: dict) -> list[str]:
    return [w for w in make_plan(project, hw=hw)["warnings"] if w.startswith("Precompute takes")]


def test_a_long_precompute_says_which_corpus_takes_a_day(tmp_path):
    project = Project.create(tmp_path / "p", "t5xxl_pixart")       # T5-XXL over 120k prompts on 64 CPU cores
    hw = {"cpus": 64, "ram_available_bytes": 64 << 30, "gpus": []}
    plan = make_plan(project, hw=hw)
    train_s, val_s = (plan["stages"][f"precompute_{s}"]["seconds"] for s in ("train", "val"))
    n_train = project.settings.corpus.n_train
    fit = int((advice.LONG_TRAIN_S - val_s) / (train_s / n_train))
    said = [w for w in plan["warnings"] if w.startswith("Precompute takes")]
    assert train_s + val_s > advice.LONG_TRAIN_S > val_s and 0 < fit < n_train
    assert len(said) == 1 and f"a corpus of about {fit} train samples (corpus.n_train={fit}) would take a day" in said[0]


# (pack, machine, settings): the train split too long; the val split alone too long (no train corpus of 1 or more
# fits beside it); an image pack's mix, each of its counts cut
_LONG = [("t5xxl_pixart", 64, []), ("t5xxl_pixart", 2, ["corpus.n_val=60000"]),
         ("qwen3vl_qwenimage", 2, ["corpus.n_image=200000", "corpus.n_val_image=30000"])]


@pytest.mark.parametrize("pack_id,cpus,settings", _LONG)
def test_every_count_a_long_precompute_names_is_at_least_one_and_plans_within_a_day(tmp_path, pack_id, cpus,
                                                                                     settings):
    """Issue 40: "a corpus of about 0 (corpus.n_train=0)" named a value that cannot work. Set as named, the counts
    plan within a day."""
    project = Project.create(tmp_path / "p", pack_id)
    project.update_settings(settings)
    hw = {"cpus": cpus, "ram_available_bytes": 64 << 30, "gpus": []}
    (said,) = _precompute_warning(Project.open(project.root), hw)
    named = re.findall(r"(corpus\.\w+)=(\d+)", said)
    assert named and all(int(n) >= 1 for _, n in named), said
    if "corpus.n_val=60000" in settings:
        assert "val samples alone leave no room" in said and any(k == "corpus.n_val" for k, _ in named)
    project.update_settings([f"{k}={n}" for k, n in named])
    assert _precompute_warning(Project.open(project.root), hw) == [], said


def test_when_not_one_sample_fits_in_a_day_the_precompute_warning_names_the_gpu(tmp_path):
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    (said,) = _precompute_warning(project, {"cpus": 1e-6, "ram_available_bytes": 64 << 30, "gpus": []})
    assert "precompute.device=cuda" in said and not re.search(r"corpus\.\w+=", said)


def test_a_calibration_whose_stage_fails_says_why_and_keeps_its_log(tmp_path):
    from trainer_core.base.errors import TrainerError
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    project.update_settings(["corpus.presets=[]"])                  # nothing to read: the corpus stage fails
    with pytest.raises(TrainerError) as e:
        calibrate(Project.open(project.root))
    log = project.root / ".calibration" / "pipeline.log"
    assert "calibration's corpus stage failed" in str(e.value) and str(log) in str(e.value)
    assert log.is_file() and "corpus" in log.read_text()
    assert not (project.root / CALIBRATION_FILE).exists()
