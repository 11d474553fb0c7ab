"""The offline demo stays offline (issue 19): a demo project never contacts the Hub — not from the
CLI, not from the Setup tab's materials panel — its materials read as ready where they lie (or
not needed, for a mocked teacher), Download missing starts nothing, and the demo folder goes
under the projects root, never into the current folder."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from hub_server import LocalHub, go_online
from trainer_core import materials
from trainer_core.base.errors import UsageError
from trainer_core.project import Project
from trainer_core.packs.lookup import find_material


@pytest.fixture
def hub(monkeypatch):
    """A loopback Hub holding nothing: any request a demo makes shows up in `hub.requests`."""
    with LocalHub({}) as h:
        go_online(monkeypatch, h.url)
        yield h


def _cli_online(hub, tmp_path, *args: str):
    """`python -m trainer_core ARGS` online against the loopback Hub (every other request is
    proxied to it too), from `tmp_path` as the current folder."""
    import subprocess
    import sys
    env = hub.client_env(tmp_path / "hf-home")
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "trainer_core", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)


def test_the_demo_through_the_cli_and_the_materials_panel_makes_no_hub_request(hub, tmp_path, isolated_env):
    from ui import materials_panel
    built = _cli_online(hub, tmp_path, "demo")
    assert built.returncode == 0, built.stderr
    # the default folder is under the projects root, not the current folder
    root = isolated_env / "gguf-trainer" / "projects" / "demo" / "t5_adapter"
    assert f"demo project ready: {root}" in built.stdout
    assert {p.name for p in tmp_path.iterdir()} <= {"hf-home"}
    assert (root / "materials" / materials.DEMO_MARKER).is_file()

    status = _cli_online(hub, tmp_path, "status", "--project", str(root), "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert {m["id"]: m["status"] for m in report["materials"]} == {
        "student": "ready", "student_tokenizer": "ready", "teacher": "ready"}

    refused = _cli_online(hub, tmp_path, "download", "--project", str(root))
    assert refused.returncode == 2 and refused.stderr.strip() == materials.DEMO_OFFLINE

    # what the Setup tab does on opening the project, on Refresh and on the two Download buttons
    table, _, one, every, summary = materials_panel.refresh(str(root), None, online=True)
    assert [row[2] for row in table["value"]] == ["ready", "ready", "ready"]
    assert not one["interactive"] and not every["interactive"] and summary == "All materials present."
    message, *_ = materials_panel.download_missing(str(root), None)
    assert "Nothing to download." in message
    message, *_ = materials_panel.download_one(str(root), "teacher")
    assert materials.DEMO_OFFLINE in message
    assert not list((root / "materials").glob(".downloads/*.pid"))
    assert hub.requests == []


def test_a_mock_teacher_demo_reads_ready_or_not_needed_with_paths(hub, tmp_path):
    from trainer_core.demo import build_demo
    from ui import materials_panel
    from ui.setup_tab import missing_required
    project = build_demo(tmp_path / "llada", "llada_image")
    statuses = {s.id: s for s in materials.all_statuses(project, online=True)}
    assert {i: s.status for i, s in statuses.items()} == {
        "student": "ready", "student_tokenizer": "ready", "teacher": "not needed", "sigvq": "ready"}
    for s in statuses.values():
        assert s.online is False and s.path, s          # where it lies (the teacher's would-be folder too)
        if s.status == "ready":
            assert s.bytes_done > 0 and (tmp_path / "llada") in Path(s.path).parents
    assert missing_required(project) == []

    for pick in statuses:
        _, _, one, every, summary = materials_panel.table_updates(project, list(statuses.values()), pick)
        assert not one["interactive"] and not every["interactive"]
    assert one["value"] == "Downloaded ✓" and every["value"] == "All downloadable materials present"
    assert summary == "All materials present."
    rows = {row[0]: row for row in materials_panel.rows(list(statuses.values()))}
    assert rows[statuses["teacher"].title][2:] == ["not needed", "", statuses["teacher"].path,
                                                  "the demo runs without it"]
    message, *_ = materials_panel.download_missing(str(project.root), None)
    assert "Nothing to download." in message
    with pytest.raises(UsageError, match="offline demo"):
        materials.start_job(project, "teacher")
    with pytest.raises(UsageError, match="offline demo"):
        materials.download(project, find_material(project.pack, "teacher"))
    assert not (project.materials_dir / ".downloads").exists()
    assert hub.requests == []


def test_a_real_project_never_links_a_demos_tiny_models(tmp_path, monkeypatch):
    from trainer_core.demo import build_demo
    demo = build_demo(tmp_path / "demo", "llada_image")
    tokenizer = demo.materials_dir / "pig-clip-tokenizer"
    material = find_material(demo.pack, "student_tokenizer")
    marker = demo.materials_dir / materials.DEMO_MARKER
    real = Project.create(tmp_path / "real", "llada_image")
    monkeypatch.setenv(materials.MATERIALS_ENV, str(demo.materials_dir))
    monkeypatch.chdir(tmp_path)
    assert materials.adopt_existing(demo) == []                 # a demo links nothing
    assert materials.discover(real, material) is None
    marker.rename(marker.with_name("unmarked.json"))            # the same folder, unmarked, would be found
    assert materials.discover(real, material) == tokenizer.resolve()


def test_the_guis_demo_folder_is_in_the_projects_root(tmp_path, monkeypatch):
    from ui.app import make_context
    monkeypatch.chdir(tmp_path)
    ctx = make_context(tmp_path / "projects", tick_s=0.3)
    try:
        assert ctx.demo_root == (tmp_path / "projects" / "demo").resolve()
    finally:
        ctx.supervisor.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["projects"]
