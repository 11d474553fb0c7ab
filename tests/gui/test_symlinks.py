"""Issue 18, item 1: the GUI never creates or opens anything through a symlink that leaves the
allowed folders, and remembered state never widens them."""
from __future__ import annotations

import os

from gradio_client import Client

from .conftest import free_port
from trainer_core.project import remember_last_project
from ui import setup_tab
from ui.app import serve


def test_create_through_a_link_out_of_the_roots_is_refused_in_the_running_app(ctx, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (ctx.projects_root / "etclink").symlink_to(outside)
    (ctx.projects_root / "dangling").symlink_to(tmp_path / "not-yet")
    app, url = serve(ctx, port=free_port(), open_browser=False, block=False)
    try:
        client = Client(url, verbose=False)
        for name in ("etclink", "dangling"):
            banner = client.predict(name, "t5xxl_pixart", str(ctx.projects_root), api_name="/create_project")[0]
            assert "is a link" in banner and "Created" not in banner, banner
    finally:
        app.close()
    assert list(outside.iterdir()) == []                       # nothing written where the link points
    assert not (tmp_path / "not-yet").exists()                 # the dangling link's target was not created


def test_a_link_inside_the_roots_is_refused_too_and_a_plain_name_works(ctx):
    (ctx.projects_root / "inner").mkdir()
    (ctx.projects_root / "alias").symlink_to(ctx.projects_root / "inner")
    assert "is a link" in setup_tab.create_project(ctx, "alias", "t5xxl_pixart", str(ctx.projects_root))[1]
    out = setup_tab.create_project(ctx, "plain", "t5xxl_pixart", str(ctx.projects_root))
    assert out[0] == str(ctx.projects_root / "plain") and (ctx.projects_root / "plain" / "project.json").is_file()


def test_a_remembered_project_outside_the_roots_is_not_opened_and_does_not_widen_them(ctx, tmp_path):
    from trainer_core.project import Project
    elsewhere = Project.create(tmp_path / "elsewhere" / "p", "t5xxl_pixart")
    remember_last_project(elsewhere.root)
    roots = ctx.paths.roots
    view = setup_tab.initial_project(ctx)
    assert view[0] is None and "outside the folders" in view[1] and "--allow-dir" in view[1]
    assert ctx.paths.roots == roots
    assert "outside" in setup_tab.open_project(ctx, str(elsewhere.root))[1]     # and stays refused
    assert os.path.isdir(elsewhere.root)
