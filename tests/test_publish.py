"""`gguf-trainer publish` against the loopback Hub (tests/hub_server.py's upload endpoints), on a copy of the
session's trained PixArt demo (tests/demo_cache.py): one commit, byte-for-byte files, no token anywhere, a drop
mid-upload and a drop at the commit, and the refusals."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import demo_cache
from conftest import cli_here
from hub_server import LocalHub
from trainer_core.base import token_store
from trainer_core.project import Project
from trainer_core.publish import planned_files

TOKEN = "hf_publish_test_token_4d2c"
REPO = "someone/pig-t5-test"


@pytest.fixture
def project(tmp_path) -> Project:
    project = Project.open(demo_cache.copy_trained("t5xxl_pixart", tmp_path))
    token_store.write_token(project.root, TOKEN)
    return project


def _online(monkeypatch, url: str) -> None:
    import huggingface_hub.constants as constants
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)      # the library's plain LFS path (no Xet here)


@pytest.fixture
def hub(monkeypatch):
    with LocalHub({}) as h:
        _online(monkeypatch, h.url)
        yield h


def _export_state(project: Project) -> dict[str, str]:
    """sha256 of every file in the output folder (the project folder aside)."""
    out = project.output_dir()
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir() if p.is_file()}


def _publish(project: Project, *extra: str):
    return cli_here("publish", "--project", str(project.root), "--repo", REPO, *extra)


def test_publish_sends_the_gguf_card_and_plot_in_one_commit_byte_for_byte(project, hub):
    r = _publish(project, "--private", "--allow-demo")
    assert r.returncode == 0, r.stderr
    local = {f.in_repo: f.local.read_bytes() for f in planned_files(project)}
    assert {project.gguf_path().name, "README.md", project.card_plot_path().name} <= set(local)
    (commit,) = hub.commits[REPO]
    assert sorted(commit["paths"]) == sorted(local) and commit["private"] is True
    steps = json.loads(project.eval_json.read_text())["trained_steps"]
    assert f"step {steps}" in commit["summary"] and commit["summary"] in r.stdout
    assert hub.repo_files(REPO) == local                               # byte for byte
    stored = {hashlib.sha256(data).hexdigest() for data in hub.lfs_objects.values()}
    assert hashlib.sha256(local[project.gguf_path().name]).hexdigest() in stored       # the GGUF went by LFS
    assert hashlib.sha256(local["README.md"]).hexdigest() not in stored                # the card in the commit
    assert local["README.md"] == project.card_path().read_bytes()
    for data in [*local.values(), r.stdout.encode(), r.stderr.encode()]:
        assert TOKEN.encode() not in data
    for data in local.values():                                        # no folder of this machine
        assert str(project.root.parent).encode() not in data
    # the same export again: the library finds nothing changed and makes no second commit
    assert _publish(project, "--allow-demo").returncode == 0 and len(hub.commits[REPO]) == 1
    # a snapshot later, published with --include-snapshots: a second commit, the new file and the rewritten card
    from trainer_core.snapshot import take_snapshot
    entry = take_snapshot(project, "last", fresh=False)
    again = {f.in_repo: f.local.read_bytes() for f in planned_files(project, include_snapshots=True)}
    assert Path(entry["path"]).name in again and Path(entry["path"]).name not in local
    assert _publish(project, "--allow-demo", "--include-snapshots").returncode == 0
    assert len(hub.commits[REPO]) == 2 and hub.repo_files(REPO) == again
    assert sorted(hub.commits[REPO][1]["paths"]) == sorted(p for p in again if again[p] != local.get(p))
    # no file of the project or the output folder holds the token but the token file itself
    for path in [*project.root.rglob("*"), *project.output_dir().iterdir()]:
        if path.is_file() and path.name != token_store.TOKEN_FILE:
            assert TOKEN.encode() not in path.read_bytes(), path


def test_a_drop_mid_upload_is_sent_again_and_a_publish_the_drop_ended_completes(project, monkeypatch):
    before = _export_state(project)
    with LocalHub({}) as hub:                  # the connection drops at the commit: the publish fails, then resumes
        _online(monkeypatch, hub.url)
        hub.drop_commits = 1
        r = _publish(project, "--allow-demo")
        assert r.returncode == 2, r.stderr
        assert "publish again" in r.stderr.strip().splitlines()[-1]
        assert REPO not in hub.commits and _export_state(project) == before
        sent = list(hub.lfs_puts)
        assert sent and all(complete for _, complete in sent)
        r = _publish(project, "--allow-demo")
        assert r.returncode == 0, r.stderr
        assert hub.lfs_puts == sent                    # what the Hub held was not sent twice
        assert hub.repo_files(REPO) == {f.in_repo: f.local.read_bytes() for f in planned_files(project)}
    with LocalHub({}) as hub:                  # the connection drops mid-upload: the library sends the file again
        _online(monkeypatch, hub.url)
        hub.drop_uploads = 1
        r = _publish(project, "--allow-demo")
        assert r.returncode == 0, r.stderr
        dropped = [oid for oid, complete in hub.lfs_puts if not complete]
        assert len(dropped) == 1 and (dropped[0], True) in hub.lfs_puts
        assert hub.repo_files(REPO) == {f.in_repo: f.local.read_bytes() for f in planned_files(project)}
    assert _export_state(project) == before


def test_publish_refusals_are_one_sentence_exit_2_and_leave_the_export(project, hub, monkeypatch):
    before = _export_state(project)

    def refused(*extra: str, repo: str = REPO) -> str:
        r = cli_here("publish", "--project", str(project.root), "--repo", repo, *extra)
        assert r.returncode == 2, (r.returncode, r.stderr)
        error = r.stderr.strip().splitlines()[-1]        # after the progress lines, if it got that far
        assert error.endswith(".") and error.count(". ") == 0 and TOKEN not in r.stderr + r.stdout
        return error

    assert "--allow-demo" in refused()                                          # a demo export
    assert "not a Hub repo name" in refused("--allow-demo", repo="bad name!")
    assert "not a Hub repo name" in refused("--allow-demo", repo="a/b/c")
    hub.refuse["create"] = (401, "Invalid credentials in Authorization header")
    assert "HTTP 401" in refused("--allow-demo")                                # a token the Hub does not know
    hub.refuse.clear()
    hub.write_tokens = {"hf_someone_else"}
    assert "HTTP 403" in refused("--allow-demo")                                # no write access
    hub.write_tokens = None
    hub.refuse["preupload"] = (413, "Storage quota exceeded for someone")
    assert "Storage quota exceeded for someone" in refused("--allow-demo")      # the Hub's refusal, its message
    hub.refuse.clear()
    token_store.write_token(project.root, "")
    assert "no Hugging Face token" in refused("--allow-demo")
    token_store.write_token(project.root, TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")                    # nothing listens there
    assert "cannot be reached" in refused("--allow-demo")
    assert REPO not in hub.commits and _export_state(project) == before
    assert not any(Path(p).name.startswith(".") and p.endswith(".tmp") for p in before)
