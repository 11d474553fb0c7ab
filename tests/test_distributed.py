"""Scale-out on the CPU: precompute split over ranks (torchrun, or independent processes given RANK and
WORLD_SIZE), and DDP training over 2 gloo processes against one process with the same global batch."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, copy_project, demo_with_corpus
from trainer_core.contract.dist import current, launcher_argv
from trainer_core.base.errors import UsageError
from trainer_core.base.events import ListReport
from trainer_core.project import Project
from trainer_core.contract.shards import shard_files
from trainer_core.stages import precompute, stage_done

TIMEOUT = 300


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    out.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return out


def stage(module: str, project: Project, *args: str, processes: int = 1, **extra: str) -> subprocess.CompletedProcess:
    argv = ([sys.executable, "-m", module] if processes == 1 else launcher_argv(module, processes, []))
    argv += ["--project", str(project.root), *args]
    return subprocess.run(argv, env=env(**extra), capture_output=True, text=True, timeout=TIMEOUT)


def shard_bytes(project: Project, split: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in shard_files(project, split)}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return demo_with_corpus(tmp_path_factory.mktemp("dist") / "t5_adapter",      # 5 val, 6 train shards
                            settings=("precompute.val_shard_size=8", "precompute.shard_size=60"))


@pytest.fixture(scope="module")
def reference(template, tmp_path_factory):
    """Every shard computed by one process."""
    root = tmp_path_factory.mktemp("ref") / "t5_adapter"
    shutil.copytree(template, root)
    project = Project.open(root)
    for split in ("val", "train"):
        assert precompute.run(project, ListReport(), split=split) == "done"
    return project


@pytest.fixture
def demo(template, tmp_path):
    return copy_project(template, tmp_path)


def test_the_rank_comes_from_the_launchers_environment():
    assert current({}) == current({"WORLD_SIZE": "1"}) and current({}).main and not current({}).distributed
    r = current({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (r.rank, r.world, r.local, r.main, r.distributed) == (3, 4, 1, False, True)
    with pytest.raises(UsageError, match="RANK 4 is not within WORLD_SIZE 4"):
        current({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(UsageError, match="must be integers"):
        current({"RANK": "x", "WORLD_SIZE": "2"})


def test_two_ranks_under_torchrun_write_the_same_shards_as_one_process(demo, reference):
    r = stage("trainer_core.stages.precompute", demo, "--split", "val", processes=2)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert shard_bytes(demo, "val") == shard_bytes(reference, "val") and len(shard_bytes(demo, "val")) == 5
    assert stage_done(demo, "precompute_val")
    assert "rank 1 of 2: val shards 1, 3" in r.stdout and "rank 0 of 2: val shards 0, 2, 4" in r.stdout


def test_a_killed_rank_only_redoes_its_own_missing_shards(demo, reference):
    """Rank 1 alone (shards 1, 3, 5) is killed once its first shard is on disk; the rerun of both ranks
    completes the split, recomputes only what was missing, and gives the one-process bytes."""
    argv = [sys.executable, "-m", "trainer_core.stages.precompute", "--project", str(demo.root), "--split", "train"]
    child = subprocess.Popen(argv, env=env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    first = demo.shards_dir("train") / "train-00001.safetensors"
    deadline = time.monotonic() + TIMEOUT
    while not first.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    before = {p.name: p.stat().st_mtime_ns for p in shard_files(demo, "train")}
    assert "train-00001.safetensors" in before and not {"train-00000.safetensors", "train-00002.safetensors"} & set(before)
    r = stage("trainer_core.stages.precompute", demo, "--split", "train", processes=2)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert shard_bytes(demo, "train") == shard_bytes(reference, "train")
    after = {p.name: p.stat().st_mtime_ns for p in shard_files(demo, "train")}
    assert all(after[name] == mtime for name, mtime in before.items())          # nothing on disk was redone
    assert f"{3 - len(before)} of them to compute" in r.stdout                    # rank 1's share of the rerun


def weights(path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def losses(project: Project) -> list[tuple[int, float]]:
    import json
    return [(p["step"], p["loss"]) for p in map(json.loads, (project.checkpoints_dir / "metrics.jsonl").read_text()
                                                .splitlines())]


SETTINGS = ["train.steps=60", "train.log_every=4", "train.val_every=20", "train.save_every=20"]


def _train(reference: Project, where, processes: int) -> tuple[Project, str]:
    """SETTINGS trained uninterrupted over `processes` on a copy of the reference shards: (the project, stdout)."""
    root = where.mktemp(f"train{processes}") / "t5_adapter"
    shutil.copytree(reference.root, root)
    project = Project.open(root)
    project.update_settings(SETTINGS)
    r = stage("trainer_core.stages.train", project, processes=processes)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return project, r.stdout


@pytest.fixture(scope="module")
def trained_one(reference, tmp_path_factory):
    return _train(reference, tmp_path_factory, 1)[0]


@pytest.fixture(scope="module")
def trained_two(reference, tmp_path_factory):
    """The same run as DDP over two processes."""
    return _train(reference, tmp_path_factory, 2)


def test_ddp_over_two_processes_follows_the_one_process_loss_curve(trained_one, trained_two):
    """Same global batch (16): each rank takes half, DDP averages the gradients. Tolerance: losses
    within 1e-5 relative and weights within 1e-4 absolute of the one-process run after 60 steps
    (float32 sums in another order; measured 1.1e-5)."""
    project, stdout = trained_two
    root = project.root
    one, two = losses(trained_one), losses(project)
    assert [s for s, _ in one] == [s for s, _ in two] == list(range(4, 61, 4))
    for (_, a), (_, b) in zip(one, two):
        assert b == pytest.approx(a, rel=1e-5)
    w1, w2 = weights(trained_one.checkpoints_dir / "last.pt"), weights(root / "checkpoints" / "last.pt")
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-4, rtol=0)
    assert stdout.count('"type": "metric"') == len(two) + 3      # rank 0 alone reports (15 points + 3 validations)


def test_a_stopped_ddp_run_resumes_to_the_same_weights(reference, trained_two, tmp_path):
    root = tmp_path / "stopped" / "t5_adapter"
    shutil.copytree(reference.root, root)
    Project.open(root).update_settings(SETTINGS)
    runs = {"straight": trained_two[0], "stopped": Project.open(root)}
    project = runs["stopped"]
    argv = launcher_argv("trainer_core.stages.train", 2, ["--project", str(project.root)])
    child = subprocess.Popen(argv, env=env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    metrics = project.checkpoints_dir / "metrics.jsonl"
    deadline = time.monotonic() + TIMEOUT
    while child.poll() is None and time.monotonic() < deadline and not (
            metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    project.stop_file.write_text("stop")
    out = child.communicate(timeout=TIMEOUT)[0]
    project.stop_file.unlink()
    assert "stop requested: saved last.pt at step" in out, out[-2000:]
    r = stage("trainer_core.stages.train", project, processes=2)
    assert r.returncode == 0 and "resumed from last.pt at step" in r.stdout
    a, b = weights(runs["straight"].checkpoints_dir / "last.pt"), weights(project.checkpoints_dir / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the loss points equal the straight run's, except the one log window the resume cut in two
    at = int(re.search(r"resumed from last.pt at step (\d+)", r.stdout).group(1))
    cut = -(-at // 4) * 4 if at % 4 else None
    assert [p for p in losses(project) if p[0] != cut] == [p for p in losses(runs["straight"]) if p[0] != cut]


def test_the_driver_runs_precompute_and_training_over_processes_and_stops_them_cleanly(demo, reference):
    """`gguf-trainer start --gpus 2` with train.gpus 2: torchrun under the pipeline driver; `stop` ends the
    run as stopped (not failed) with last.pt saved, and `run` finishes it."""
    from conftest import cli
    demo.update_settings(["train.gpus=2", "train.steps=3000", "train.log_every=5", "train.val_every=1000",
                          "train.save_every=1000"])
    r = cli("start", "--project", str(demo.root), "--gpus", "2")
    assert r.returncode == 0 and "precompute.gpus: 2" in r.stdout, r.stderr
    metrics = demo.checkpoints_dir / "metrics.jsonl"
    deadline = time.monotonic() + TIMEOUT
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cli("stop", "--project", str(demo.root), "--timeout", "120").returncode == 0
    status = cli("status", "--project", str(demo.root), "--json")
    import json
    report = json.loads(status.stdout)
    assert report["status"] == "stopped", report
    assert shard_bytes(demo, "train") == shard_bytes(reference, "train")           # the ranks' shards
    assert (demo.checkpoints_dir / "last.pt").is_file()
    log = demo.pipeline_log.read_text()
    assert "rank 1 of 2: train shards" in log and "stop requested: saved last.pt at step" in log
    assert "[train] stopped" in log and "the pipeline driver is gone" not in log
