"""Issue 18 items 3 and 5: a full disk and read-only or odd folders end in one sentence, nothing is
half-written, and the driver always records a final state.

Where the test process may mount a tmpfs (root, as in CI here), the disk is really full or really
read-only; the in-process tests inject the OSError a writer gets, so they run anywhere.
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import demo_cache
from conftest import cli
from trainer_core.base import diskspace
from trainer_core.base.atomic import atomic_path, atomic_write_bytes
from trainer_core.base.errors import DiskFullError, TrainerError
from trainer_core.contract import checkpoints
from trainer_core.contract.gguf_io import write_gguf
from trainer_core.contract.shards import write_shard
from trainer_core.project import Project
from trainer_core.stages.base import EXIT_FAILED, stage_main


def _can_mount() -> bool:
    return os.geteuid() == 0 and subprocess.run(["which", "mount"], capture_output=True).returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
    """A mount function: mount(size) gives a fresh tmpfs folder of that size (unmounted after the test)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        assert r.returncode == 0, r.stderr
        mounted.append(where)
        return where
    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(folder: Path, leave: int) -> None:
    """Fill the disk of `folder` until about `leave` bytes are free."""
    free = diskspace.free_bytes(folder)
    with open(folder / "ballast", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def _no_temps(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*.tmp")]


# ---------------------------------------------------------------- writers

def test_a_write_that_does_not_fit_keeps_the_old_file_and_names_file_and_disk(tmp_path, tmpfs, monkeypatch):
    if _can_mount():
        disk = tmpfs("256k")
        target = disk / "state.json"
        target.write_bytes(b"old")
        _fill(disk, 8 << 10)
    else:                                   # inject what a full disk answers to the write
        target = tmp_path / "state.json"
        target.write_bytes(b"old")
        real = os.fdopen

        def full(fd, *args, **kwargs):
            f = real(fd, *args, **kwargs)
            f.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
            return f
        monkeypatch.setattr(os, "fdopen", full)
    with pytest.raises(DiskFullError) as e:
        atomic_write_bytes(target, b"x" * (64 << 10))
    message = str(e.value)
    assert message.startswith("No space left on ") and str(target) in message and "free" in message
    assert "\n" not in message and "Traceback" not in message
    assert target.read_bytes() == b"old" and _no_temps(target.parent) == []


def test_a_shard_that_cannot_fit_is_refused_before_a_byte_is_written(tmp_path, monkeypatch):
    free = 1 << 20
    monkeypatch.setattr(diskspace, "free_bytes", lambda path: free)
    tensors = {"t_pack": torch.zeros(1024, 512, dtype=torch.bfloat16)}            # 1 MB of rows
    path = tmp_path / "shards" / "train" / "train-00000.safetensors"
    with pytest.raises(DiskFullError) as e:
        write_shard(path, tensors, {"pack": "x"}, ["a prompt"])
    assert f"needs ~{diskspace.human(1024 * 512 * 2 + len(json.dumps({'meta': {'pack': 'x'}, 'prompts': ['a prompt']})))}" \
        in str(e.value)
    assert f"free {diskspace.human(free)}" in str(e.value)
    assert not path.exists() and _no_temps(tmp_path) == []


def test_a_checkpoint_that_cannot_fit_keeps_the_previous_one(tmp_path, monkeypatch):
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    record = {"model": {"w": torch.ones(256, 256)}, "step": 1}
    checkpoints.save(project, checkpoints.LAST, record, checkpoints.Sidecar(trained_steps=1, planned_steps=10))
    before = checkpoints.weights_path(project, checkpoints.LAST).read_bytes()
    monkeypatch.setattr(diskspace, "free_bytes", lambda path: 1 << 20)
    bigger = {"model": {"w": torch.ones(1024, 1024)}, "step": 2}                  # 4 MB of tensors
    with pytest.raises(DiskFullError, match=r"needs ~4\.0 MB, free 1\.0 MB"):
        checkpoints.save(project, checkpoints.LAST, bigger, checkpoints.Sidecar(trained_steps=2, planned_steps=10))
    assert checkpoints.weights_path(project, checkpoints.LAST).read_bytes() == before
    assert checkpoints.read_sidecar(project, checkpoints.LAST).trained_steps == 1
    assert _no_temps(project.checkpoints_dir) == []


def test_torch_save_into_a_really_full_disk_is_one_sentence(tmpfs):
    if not _can_mount():
        pytest.skip("needs a tmpfs (root); the injected cases above cover the sentence")
    disk = tmpfs("1m")
    path = disk / "last.pt"
    with pytest.raises(DiskFullError, match="No space left on .* while writing last.pt"):
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save({"w": torch.ones(1 << 20)}, f)                               # 4 MB into 1 MB
    assert not path.exists() and _no_temps(disk) == []


# ---------------------------------------------------------------- stage and driver

def test_a_stage_that_runs_out_of_disk_reports_the_sentence_not_a_traceback(tmp_path, capsys):
    project = Project.create(tmp_path / "p", "t5xxl_pixart")

    def run(project, report, should_stop):
        raise OSError(errno.ENOSPC, "No space left on device", str(project.root / "checkpoints" / "last.pt"))
    code = stage_main("train", run, ["--project", str(project.root)])
    captured = capsys.readouterr()
    errors = [json.loads(line) for line in captured.out.splitlines() if '"error"' in line]
    assert code == EXIT_FAILED and "Traceback" not in captured.err
    assert len(errors) == 1 and errors[0]["payload"]["message"].startswith("No space left on ")
    assert "last.pt" in errors[0]["payload"]["message"] and "traceback" not in errors[0]["payload"]


def test_the_driver_records_its_final_state_when_the_disk_is_full(tmp_path, monkeypatch):
    """Every write of the driver fails as on a full disk (state.json's atomic write, events.jsonl,
    pipeline.log): the run still ends 'failed' in state.json, written over the old file."""
    from trainer_core import pipeline
    from trainer_core.base.events import EventWriter
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    project.update_settings(["corpus.presets=[]"])          # the corpus stage fails at once: nothing to read

    def full(*args, **kwargs):
        raise DiskFullError("No space left on the test disk while writing state.json.")
    monkeypatch.setattr(Project, "write_state", full)
    monkeypatch.setattr(EventWriter, "write", lambda self, event: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))
                        if fd > 2 else real_write(fd, data))
    code = pipeline.run_pipeline(Project.open(project.root), only=["corpus"])
    state = json.loads(project.state_json.read_text())
    assert code == 2                                            # the corpus error is bad input (issue 55)
    assert state["status"] == "failed" and state["stages"]["corpus"]["status"] == "failed"
    assert state["error"] and "corpus" in json.dumps(state["stages"]["corpus"])


def test_an_export_into_a_full_disk_fails_with_the_sentence_and_the_next_run_finishes(tmp_path, tmpfs):
    if not _can_mount():
        pytest.skip("needs a tmpfs (root): the export writes in a child process")
    out = tmpfs("4m")
    root = demo_cache.copy_built("t5xxl_pixart", tmp_path)
    assert cli("set", "--project", str(root), "--set", f"export.output_dir={out}", "--set", "train.steps=20",
               "--set", "train.val_every=10", "--set", "train.save_every=10").returncode == 0
    _fill(out, 20 << 10)                         # 20 KB left: the adapter (~150 KB) does not fit
    r = cli("run", "--project", str(root), timeout=600)
    state = json.loads((root / "state.json").read_text())
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert state["status"] == "failed" and state["stages"]["export"]["status"] == "failed"
    assert state["error"].startswith("No space left on ") and str(out) in state["error"]
    assert "Traceback" not in r.stderr and _no_temps(out) == []
    assert state["stages"]["train"]["status"] == "done"
    (out / "ballast").unlink()                   # space again: the run continues with the export
    r = cli("run", "--project", str(root), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "train] already done" in (root / "pipeline.log").read_text()
    assert list(out.glob("*-f16.gguf"))


def test_a_gguf_that_fills_the_disk_while_its_tensors_are_written_is_one_sentence(tmpfs):
    """No space check up front (needs=0), so the disk runs out inside numpy's tofile, whose short
    write carries no errno: still the full-disk sentence, and no temp left behind."""
    if not _can_mount():
        pytest.skip("needs a tmpfs (root) for a disk that really fills")
    disk = tmpfs("256k")
    target = disk / "big.gguf"
    with pytest.raises(TrainerError) as err:
        write_gguf(target, "pig", [("t", np.zeros(200_000, np.float32))])      # 800 KB into 256 KB
    assert str(err.value).startswith("No space left on ") and str(disk) in str(err.value)
    assert not target.exists() and _no_temps(disk) == []


# ---------------------------------------------------------------- read-only and odd folders

MUTATING = (       # (command, args, whether it must say the folder is read-only)
    ("set", ("--set", "train.steps=50"), True),
    ("reset", ("state",), True),
    ("reset", ("train",), True),
    ("run", (), True),
    ("start", (), True),
    ("stop", (), True),
    ("download", (), True),
    ("snapshot", ("--checkpoint", "last"), False),     # nothing to snapshot yet: says that instead
)


def test_a_read_only_project_gets_one_sentence_from_every_mutating_command(tmp_path, tmpfs):
    if _can_mount():
        disk = tmpfs("8m")
        root = disk / "p"
        Project.create(root, "t5xxl_pixart")
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    else:
        root = tmp_path / "p"
        Project.create(root, "t5xxl_pixart")
        for p in (root, *root.rglob("*")):
            p.chmod(p.stat().st_mode & ~0o222)
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}
    for command, args, read_only in MUTATING:
        r = cli(command, "--project", str(root), *args, timeout=120)
        said = (r.stderr + r.stdout).strip()
        assert "Traceback" not in said and "Errno" not in said, (command, said)
        assert r.returncode in (1, 2) and said.count("\n") == 0, (command, r.returncode, said)
        if read_only:
            assert r.returncode == 2 and ("read-only" in said or "cannot be written" in said), (command, said)
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} == before


def test_a_file_in_the_way_of_a_new_project_is_one_sentence(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = cli("new", "--project", str(afile / "sub"), "--pack", "t5xxl_pixart")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{afile} is a file, not a folder" in r.stderr
    r = cli("status", "--project", str(afile))
    assert r.returncode == 2 and f"{afile} is a file, not a project folder" in r.stderr
    r = cli("new", "--project", str(afile), "--pack", "t5xxl_pixart")
    assert r.returncode == 2 and "is a file, not a folder" in r.stderr


def test_the_gui_shows_the_sentence_for_a_read_only_folder(tmp_path, tmpfs, monkeypatch):
    """Creating a project in, and saving the settings of a project on, a read-only disk: the Setup
    tab's message is the sentence, nothing is raised."""
    if not _can_mount():
        pytest.skip("needs a tmpfs (root) to make a folder read-only for root")
    from ui import setup_tab
    from ui.app import make_context
    from ui.settings_form import FIELDS
    disk = tmpfs("8m")
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio-tmp"))
    ctx = make_context(disk, demo_root=tmp_path / "demo", tick_s=0.3)
    try:
        made = setup_tab.create_project(ctx, "mine", "t5xxl_pixart", str(disk))
        assert made[0] == str(disk / "mine"), made[1]
        values = [u["value"] for u in made[3:3 + len(FIELDS)]]
        values[[f.key for f in FIELDS].index("train.steps")] = "1234"          # a change to save
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        out = setup_tab.create_project(ctx, "other", "t5xxl_pixart", str(disk))
        assert out[0] is None and "read-only" in out[1] and "\n" not in out[1]
        saved = setup_tab.save_settings(ctx, made[0], "", *values)
        assert "read-only" in saved[1] and "\n" not in saved[1]
    finally:
        ctx.supervisor.close()
