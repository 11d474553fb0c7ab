"""The Hugging Face token: a project's own in `.hf_token` (0600 from creation on), never in
project.json; one an older version left in project.json moves there once; without one, the Hugging
Face token store; never printed (`set`, `status --json`)."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from trainer_core import materials
from trainer_core.base import token_store
from trainer_core.base.atomic import atomic_write_json
from trainer_core.project import Project

SECRET = "hf_NeverInProjectJson123"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def project(tmp_path):
    return Project.create(tmp_path / "proj", "t5xxl_pixart")


def test_a_set_token_lives_in_hf_token_readable_only_by_the_user(project, monkeypatch):
    renamed = []
    replace = os.replace

    def watching_replace(src, dst, *args, **kwargs):
        if Path(dst).name == token_store.TOKEN_FILE:
            renamed.append(mode(Path(src)))         # the temp file, just before it becomes .hf_token
        return replace(src, dst, *args, **kwargs)
    monkeypatch.setattr(os, "replace", watching_replace)
    old_umask = os.umask(0)                         # even a umask that lets everyone read
    try:
        project.update_settings(["hf_token=" + SECRET, "train.steps=1234"])
    finally:
        os.umask(old_umask)
    token_file = project.root / token_store.TOKEN_FILE
    assert renamed == [0o600] and mode(token_file) == 0o600
    assert token_file.read_text(encoding="utf-8").strip() == SECRET
    text = project.project_json.read_text(encoding="utf-8")
    assert SECRET not in text and "hf_token" not in json.loads(text) and json.loads(text)["train"]["steps"] == 1234
    assert not list(project.root.glob(f"{token_store.TOKEN_FILE}.*"))          # no temp file left
    reopened = Project.open(project.root)
    assert reopened.settings.hf_token == SECRET and materials.token_for(reopened) == SECRET
    assert SECRET not in repr(reopened.settings)

    token_file.chmod(0o644)                        # copied in with looser permissions: narrowed on read
    assert Project.open(project.root).settings.hf_token == SECRET and mode(token_file) == 0o600
    project.update_settings(["hf_token="])         # an empty token clears it
    assert not token_file.exists() and Project.open(project.root).settings.hf_token == ""


def test_a_token_left_in_project_json_moves_to_hf_token_once(project):
    raw = json.loads(project.project_json.read_text(encoding="utf-8"))
    atomic_write_json(project.project_json, {**raw, "hf_token": SECRET, "train": {**raw["train"], "steps": 777}})
    assert SECRET in project.project_json.read_text(encoding="utf-8")      # as an older version wrote it

    opened = Project.open(project.root)
    token_file = project.root / token_store.TOKEN_FILE
    assert opened.settings.hf_token == SECRET and opened.settings.train.steps == 777
    assert mode(token_file) == 0o600 and token_file.read_text(encoding="utf-8").strip() == SECRET
    data = json.loads(project.project_json.read_text(encoding="utf-8"))
    assert "hf_token" not in data and data["train"]["steps"] == 777 and data == {**raw, "train": data["train"]}

    stamps = (project.project_json.stat().st_mtime_ns, token_file.stat().st_mtime_ns)
    again = Project.open(project.root)                      # done: nothing is rewritten a second time
    assert again.settings.hf_token == SECRET
    assert (project.project_json.stat().st_mtime_ns, token_file.stat().st_mtime_ns) == stamps


def test_without_a_project_token_the_hugging_face_login_is_used(project, monkeypatch):
    import huggingface_hub.constants as hf_constants
    stored = Path(hf_constants.HF_TOKEN_PATH)              # the file `hf auth login` writes (under the test HOME)
    assert materials.token_for(project) is None
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text("hf_fromTheLogin\n", encoding="utf-8")
    assert materials.token_for(project) == "hf_fromTheLogin"
    monkeypatch.setenv("HF_TOKEN", "hf_fromTheEnvironment")
    assert materials.token_for(project) == "hf_fromTheEnvironment"
    project.update_settings(["hf_token=" + SECRET])         # the project's own overrides both
    assert materials.token_for(Project.open(project.root)) == SECRET
    assert "not set in the project" in token_store.describe("") and SECRET not in token_store.describe(SECRET)


def test_set_and_status_json_never_show_the_token(tmp_path, run_cli):
    root = tmp_path / "cli_proj"
    assert run_cli("new", "--project", str(root), "--pack", "t5xxl_pixart").returncode == 0
    r = run_cli("set", "--project", str(root), "--set", "hf_token=" + SECRET)
    assert r.returncode == 0 and "hf_token: set (hidden)" in r.stdout and SECRET not in r.stdout + r.stderr
    assert mode(root / token_store.TOKEN_FILE) == 0o600
    assert SECRET not in (root / "project.json").read_text(encoding="utf-8")
    r = run_cli("status", "--project", str(root), "--json")
    assert r.returncode == 0 and SECRET not in r.stdout + r.stderr
    assert json.loads(r.stdout)["hf_token"].startswith("set in the project")
