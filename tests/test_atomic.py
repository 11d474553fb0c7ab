"""base/atomic.py: the cleanup of temps an interrupted atomic write left (the writers themselves are
tested in test_disk_errors.py and test_project.py)."""
from __future__ import annotations

import errno
from pathlib import Path

from trainer_core.base.atomic import atomic_write_text, remove_stale_temps, remove_temps_in


def test_only_the_targets_temps_go_and_the_targets_stay(tmp_path):
    target = tmp_path / "state.json"
    atomic_write_text(target, "{}")
    mine = [tmp_path / ".state.json.a1b2.tmp", tmp_path / ".state.json.zz.tmp"]
    other = [tmp_path / ".project.json.a1.tmp", tmp_path / "state.json.tmp", tmp_path / ".state.jsonx.q.tmp"]
    for f in mine + other:
        f.write_text("half")
    assert sorted(remove_stale_temps(target, tmp_path / "missing" / "x.json")) == sorted(mine)
    assert target.read_text() == "{}" and all(f.exists() for f in other) and not any(f.exists() for f in mine)


def test_a_folder_that_refuses_the_delete_keeps_its_temps_and_nothing_raises(tmp_path, monkeypatch):
    (tmp_path / ".train.txt.k.tmp").write_text("half")
    (tmp_path / ".state.json.k.tmp").write_text("half")

    def refuse(self, missing_ok=False):       # a read-only folder (root ignores chmod, so it is simulated)
        raise OSError(errno.EROFS, "Read-only file system", str(self))
    monkeypatch.setattr(Path, "unlink", refuse)
    assert remove_temps_in([tmp_path]) == [] and remove_stale_temps(tmp_path / "state.json") == []
    assert (tmp_path / ".train.txt.k.tmp").exists()
