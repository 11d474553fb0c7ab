"""contract/checkpoints.py: names, the typed sidecar (old and new), format checks, kept steps."""
from __future__ import annotations

import io
import json

import pytest
import torch

from trainer_core.base.errors import TrainerError
from trainer_core.contract import checkpoints
from trainer_core.contract.checkpoints import BEST, LAST, CheckpointError, Sidecar
from trainer_core.project import Project


@pytest.fixture
def project(tmp_path):
    return Project.create(tmp_path / "p", "t5xxl_pixart")


def _record(step: int) -> dict:
    return {"config": {}, "model": {"w": torch.full((2,), float(step))}, "step": step}


def test_save_and_load_round_trip_with_a_typed_sidecar(project):
    side = Sidecar(trained_steps=7, planned_steps=20, best_val_cos=0.5, val_cos=0.25, val={"val_cos": 0.25},
                   val_step=7, time=1.0)
    path = checkpoints.save(project, LAST, _record(7), side)
    assert path == project.checkpoints_dir / "last.pt" and checkpoints.exists(project, LAST)
    assert not checkpoints.exists(project, BEST)
    on_disk = json.loads(path.with_suffix(".json").read_text())
    assert on_disk["step"] == 7 and on_disk["planned_steps"] == 20 and "steps" not in on_disk
    assert checkpoints.read_sidecar(project, LAST) == side
    loaded = checkpoints.load(project, LAST)
    assert loaded["format"] == checkpoints.FORMAT and torch.equal(loaded["model"]["w"], torch.full((2,), 7.0))


def test_sidecars_of_earlier_versions_still_read(project):
    project.checkpoints_dir.mkdir()
    (project.checkpoints_dir / "last.json").write_text(json.dumps({"step": 5000, "steps": 20000}))
    side = checkpoints.read_sidecar(project, LAST)
    assert side.trained_steps == 5000 and side.planned_steps == 20000
    (project.checkpoints_dir / "best.json").write_text("{not json")
    assert checkpoints.read_sidecar(project, BEST) is None


def test_another_format_is_refused_with_a_sentence(project):
    path = checkpoints.save(project, BEST, _record(3), Sidecar(trained_steps=3))
    torch.save({"format": checkpoints.FORMAT + 1, "model": {}, "step": 3}, path)
    with pytest.raises(CheckpointError, match=f"format {checkpoints.FORMAT + 1}"):
        checkpoints.load(project, BEST)


def test_a_damaged_or_missing_checkpoint_is_one_clear_error(project):
    with pytest.raises(TrainerError, match="has not saved it yet"):
        checkpoints.load(project, BEST)
    project.checkpoints_dir.mkdir()
    (project.checkpoints_dir / "best.pt").write_bytes(b"\x80\x02 half a file")
    with pytest.raises(CheckpointError, match="is damaged"):
        checkpoints.load(project, BEST)


def test_names_are_last_best_or_a_kept_step(project):
    assert checkpoints.weights_path(project, "step40") == project.checkpoints_dir / "history" / "step40.pt"
    for bad in ("latest", "step", "stepx", "../x"):
        with pytest.raises(CheckpointError, match="is not a checkpoint"):
            checkpoints.weights_path(project, bad)


def test_kept_steps_list_prune_and_delete(project):
    for step in (10, 20, 30):
        record = {**_record(step), "steps": 30}            # an earlier version's kept step: "steps"
        checkpoints.save_kept_step(project, record, Sidecar(trained_steps=step, planned_steps=30))
    assert [row["step"] for row in checkpoints.kept_steps(project)] == [30, 20, 10]
    assert checkpoints.load(project, "step10")["planned_steps"] == 30
    assert checkpoints.prune_kept_steps(project, 2) == [10]
    assert [row["id"] for row in checkpoints.kept_steps(project)] == ["step30", "step20"]
    checkpoints.delete_kept_step(project, "step20")
    assert not (project.checkpoints_dir / "history" / "step20.json").exists()
    with pytest.raises(CheckpointError, match="no kept step step20"):
        checkpoints.delete_kept_step(project, "step20")
    assert checkpoints.prune_kept_steps(project, 0) == []          # 0 keeps all


def test_archive_moves_the_folder_aside(project):
    assert checkpoints.archive(project) is None                       # nothing to archive
    checkpoints.save(project, LAST, _record(1), Sidecar(trained_steps=1))
    target = checkpoints.archive(project)
    assert target.name.startswith("checkpoints.stale-") and (target / "last.pt").is_file()
    assert not project.checkpoints_dir.exists()


# ---------------------------------------------------------------- damaged files (issue 18, item 4)

def test_a_checkpoint_that_does_not_read_back_never_replaces_the_previous_one(project, monkeypatch):
    checkpoints.save(project, LAST, _record(5), Sidecar(trained_steps=5))
    real_save = torch.save

    def truncated_save(obj, f):              # a write that went wrong: half the bytes (save writes to a file object)
        buf = io.BytesIO()
        real_save(obj, buf)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])
    monkeypatch.setattr(torch, "save", truncated_save)
    with pytest.raises(checkpoints.DamagedCheckpointError, match="does not read back.*previous last.pt is kept"):
        checkpoints.save(project, LAST, _record(6), Sidecar(trained_steps=6))
    monkeypatch.setattr(torch, "save", real_save)
    assert checkpoints.load(project, LAST)["step"] == 5
    assert checkpoints.read_sidecar(project, LAST).trained_steps == 5
    assert not list(project.checkpoints_dir.glob(".*.tmp"))


def test_resume_takes_the_newest_checkpoint_that_reads(project):
    needs = ("model", "step")
    assert checkpoints.load_resumable(project, needs) == (None, None, [])
    checkpoints.save(project, BEST, _record(4), Sidecar(trained_steps=4))
    path = checkpoints.save(project, LAST, _record(6), Sidecar(trained_steps=6))
    which, record, skipped = checkpoints.load_resumable(project, needs)
    assert (which, record["step"], skipped) == (LAST, 6, [])
    path.write_bytes(path.read_bytes()[:100])                       # truncated
    which, record, skipped = checkpoints.load_resumable(project, needs)
    assert (which, record["step"]) == (BEST, 4) and len(skipped) == 1 and "last.pt is damaged" in skipped[0]
    path.write_bytes(b"garbage garbage garbage")
    assert checkpoints.load_resumable(project, needs)[0] == BEST
    which, record, skipped = checkpoints.load_resumable(project, needs + ("optimizer",))   # best lacks a key
    assert which is None and record is None and "best.pt lacks optimizer" in skipped[1]


def test_a_checkpoint_of_another_format_is_not_skipped_silently(project):
    path = checkpoints.save(project, LAST, _record(3), Sidecar(trained_steps=3))
    torch.save({"format": checkpoints.FORMAT + 1, "model": {}, "step": 3}, path)
    with pytest.raises(CheckpointError, match=f"format {checkpoints.FORMAT + 1}"):
        checkpoints.load_resumable(project, ("model",))


def test_a_bad_checkpoint_name_is_bad_input():
    from trainer_core.base.errors import UsageError
    with pytest.raises(UsageError) as caught:
        checkpoints.parse_name("nope")
    assert caught.value.exit_code == 2 and isinstance(caught.value, CheckpointError)


def test_temps_of_interrupted_saves_are_removed(project):
    checkpoints.save(project, LAST, _record(1), Sidecar(trained_steps=1))
    history = project.checkpoints_dir / "history"
    history.mkdir()
    stale = [project.checkpoints_dir / ".best.pt.ab12cd.tmp", project.checkpoints_dir / ".last.json.x1.tmp",
             history / ".step40.pt.zz.tmp"]
    for tmp in stale:
        tmp.write_bytes(b"x" * 10)
    assert sorted(checkpoints.remove_temps(project)) == sorted(stale)
    assert not any(tmp.exists() for tmp in stale) and checkpoints.exists(project, LAST)
