"""The GUI's path confinement: nothing outside the allowed roots, however it is spelled."""
from __future__ import annotations

import pytest

from ui.paths import PathPolicy, PathRefused


@pytest.fixture
def policy(tmp_path):
    (tmp_path / "root" / "proj").mkdir(parents=True)
    (tmp_path / "root" / "proj" / "project.json").write_text("{}")
    (tmp_path / "root" / "a.gguf").write_bytes(b"x" * 10)
    (tmp_path / "root" / "notes.txt").write_text("hi")
    (tmp_path / "root" / ".hidden").write_text("no")
    (tmp_path / "outside").mkdir()
    return PathPolicy([tmp_path / "root"])


@pytest.mark.parametrize("text", ["/etc/passwd", "/etc", "/", "~/.ssh"])
def test_system_paths_are_refused(policy, text):
    with pytest.raises(PathRefused, match="outside the folders"):
        policy.check(text)


def test_dot_dot_out_of_a_root_is_refused(policy, tmp_path):
    with pytest.raises(PathRefused, match="outside"):
        policy.check(str(tmp_path / "root" / ".." / "outside"))
    with pytest.raises(PathRefused, match="outside"):
        policy.check(str(tmp_path / "root" / "proj" / ".." / ".." / ".." / ".." / "etc" / "passwd"))
    assert policy.check(str(tmp_path / "root" / "proj" / "..")) == (tmp_path / "root").resolve()


def test_relative_and_empty_paths_are_refused(policy):
    for text in ("../../", "root/proj", ""):
        with pytest.raises(PathRefused):
            policy.check(text)


def test_a_symlink_out_of_a_root_is_refused_and_not_listed(policy, tmp_path):
    (tmp_path / "root" / "etc-link").symlink_to("/etc")
    (tmp_path / "root" / "inner-link").symlink_to(tmp_path / "root" / "proj")
    with pytest.raises(PathRefused, match="outside"):
        policy.check(str(tmp_path / "root" / "etc-link" / "passwd"))
    _, entries = policy.browse(str(tmp_path / "root"), "any")
    names = [e.name for e in entries]
    assert "etc-link" not in names and "inner-link" in names


def test_browse_lists_folders_first_marks_projects_and_filters_kinds(policy, tmp_path):
    folder, entries = policy.browse(str(tmp_path / "root"), "model")
    assert folder == (tmp_path / "root").resolve()
    assert [(e.name, e.is_dir, e.is_project) for e in entries] == [("proj", True, True), ("a.gguf", False, False)]
    assert entries[1].size == 10
    _, dirs = policy.browse(str(tmp_path / "root"), "dir")
    assert [e.name for e in dirs] == ["proj"]
    _, text = policy.browse(str(tmp_path / "root"), "text")
    assert [e.name for e in text] == ["proj", "notes.txt"]      # dot-files hidden
