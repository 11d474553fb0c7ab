"""Setup's handlers (issue 19): a refused action keeps the open project; the projects root chosen
in a local app, remembered, and refused in a shared one; the app's controls for both."""
from __future__ import annotations

import json
import os

import pytest

from trainer_core.cli import DEMO_FOLDER
from trainer_core.project import default_projects_root, user_dir
from ui import setup_tab
from ui.paths import PathRefused
from ui.projects_root import remembered_root
from ui.settings_form import FIELDS

PACK = "t5xxl_pixart"


def _create(ctx, name="mine", root=None, current=None):
    return setup_tab.create_project(ctx, name, PACK, str(root or ctx.projects_root), current)


def _settings_file():
    return json.loads((user_dir() / "settings.json").read_text())


# ------------------------------------------------------------ a refusal keeps the open project

def test_a_refused_create_open_or_demo_keeps_the_open_project_and_shows_why(ctx):
    made = _create(ctx)
    current = made[0]
    title = made[2]
    assert current == str(ctx.projects_root / "mine") and f"`{current}`" in title
    refusals = {"outside": _create(ctx, "x", "/etc", current),
                "already": _create(ctx, "mine", None, current),
                "without slashes": _create(ctx, "../escape", None, current),
                "project folder": setup_tab.open_project(ctx, "/etc", current),
                "no_such_pack": setup_tab.run_demo(ctx, "no_such_pack", current)}
    for words, out in refusals.items():
        assert out[0] == current, (words, out[1])                   # the project stays open …
        assert out[2] == title and "No project open" not in out[2]
        assert "gt-error" in out[1] and words in out[1], (words, out[1])        # … and the error is shown
        assert all("value" not in u for u in out[3:3 + len(FIELDS)])        # what the user typed stays
        assert out[-2]["interactive"] is True                               # Start still belongs to it
    # with nothing open, a refusal leaves nothing open
    assert _create(ctx, "x", "/etc")[0] is None


# ------------------------------------------------------------ the projects root

@pytest.fixture
def local_ctx(ctx):
    ctx.local = True          # what `serve` sets on loopback without a login
    return ctx


def test_a_local_app_changes_the_projects_root_and_remembers_it(local_ctx, tmp_path):
    ctx = local_ctx
    old_root = ctx.projects_root
    other = tmp_path / "elsewhere"
    (other / "existing").mkdir(parents=True)
    assert "outside the folders" in _create(ctx, "there", other)[1]
    current = _create(ctx)[0]                                     # open, under the old root
    out = setup_tab.change_root(ctx, str(other), current)
    view, (root_field, shown, entries) = out[:-3], out[-3:]
    assert "projects root is now" in view[1] and "was closed" in view[1] and view[0] is None
    assert root_field["value"] == str(other.resolve()) and shown == str(other.resolve())
    assert [path for _, path in entries["choices"]] == [str(other.resolve() / "existing")]      # the browser is there
    assert ctx.projects_root == other.resolve()
    assert ctx.paths.check(str(ctx.demo_root)) == ctx.demo_root == (tmp_path / "demo").resolve()   # named: kept
    assert remembered_root() == other.resolve() and _settings_file()["projects_root"] == str(other.resolve())
    # the allowed folders come from the new root alone: the old one is out, a project there is refused
    with pytest.raises(PathRefused):
        ctx.paths.check(str(old_root / "mine"))
    assert "outside the folders" in setup_tab.open_project(ctx, str(old_root / "mine"))[1]
    there = _create(ctx, "there", other)
    assert there[0] == str(other.resolve() / "there"), there[1]
    # a project inside the new root stays open, with the form as the user left it
    inner = other / "inner"
    inner.mkdir()
    inside = _create(ctx, "p", inner)[0]
    stays = setup_tab.change_root(ctx, str(inner), inside)
    assert stays[0] == inside and "was closed" not in stays[1] and f"`{inside}`" in stays[2]
    assert all("value" not in u for u in stays[3:3 + len(FIELDS)])


def test_the_new_root_must_be_a_real_folder_and_links_in_it_stay_confined(local_ctx, tmp_path):
    ctx = local_ctx
    before = (ctx.projects_root, ctx.paths.roots)
    (tmp_path / "a-file").write_text("x")
    for text, words in [("", "empty"), ("relative/dir", "not a full path"), (str(tmp_path / "nope"), "not an existing"),
                        (str(tmp_path / "a-file"), "not an existing"), ("/", "filesystem root"),
                        (str(user_dir()), "settings folder")]:
        user_dir().mkdir(parents=True, exist_ok=True)
        out = setup_tab.change_root(ctx, text, None)
        assert words in out[1], (text, out[1])
        assert all(u == {"__type__": "update"} for u in out[-3:])
    assert (ctx.projects_root, ctx.paths.roots) == before and remembered_root() is None
    # a link is taken for the folder it points to; a link inside the root out of it is still refused
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    os.symlink(real, tmp_path / "alias")
    os.symlink("/etc", real / "out")
    setup_tab.change_root(ctx, str(tmp_path / "alias"), None)
    assert ctx.projects_root == real.resolve() and remembered_root() == real.resolve()
    assert ctx.paths.check(str(tmp_path / "alias" / "sub")) == real.resolve() / "sub"
    with pytest.raises(PathRefused):
        ctx.paths.check(str(real / "out" / "passwd"))


def test_a_shared_or_authenticated_app_refuses_a_new_root(ctx, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    current = _create(ctx)[0]
    before = (ctx.projects_root, ctx.paths.roots)
    out = setup_tab.change_root(ctx, str(other), current)
    assert "served on this computer without a login" in out[1] and out[0] == current
    assert (ctx.projects_root, ctx.paths.roots) == before and remembered_root() is None
    assert not (user_dir() / "settings.json").is_file() or "projects_root" not in _settings_file()


def test_the_app_marks_only_a_loopback_app_without_login_local():
    from ui.app import is_local
    assert is_local("127.0.0.1", False, None) and is_local("localhost", False, None)
    assert not is_local("127.0.0.1", False, "me:password1") and not is_local("0.0.0.0", False, None)
    assert not is_local("127.0.0.1", True, None)


def test_the_remembered_root_is_used_at_the_next_local_start_only(tmp_path, monkeypatch):
    from ui import app as app_module
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    (user_dir()).mkdir(parents=True, exist_ok=True)
    (user_dir() / "settings.json").write_text(json.dumps({"projects_root": str(chosen)}))
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio-tmp"))
    seen = []
    monkeypatch.setattr(app_module, "serve", lambda ctx, *a, **k: seen.append(ctx))
    try:
        assert app_module.main(app_module.ServeOptions(open_browser=False)) == 0
        assert seen[0].projects_root == chosen.resolve() and seen[0].local is True
        assert seen[0].demo_root == chosen.resolve() / DEMO_FOLDER               # the demo folder follows the root
        assert app_module.main(app_module.ServeOptions(open_browser=False, auth="me:password12")) == 0
        assert seen[1].projects_root == default_projects_root().resolve() and seen[1].local is False
        explicit = tmp_path / "explicit"
        assert app_module.main(app_module.ServeOptions(open_browser=False, projects_root=str(explicit))) == 0
        assert seen[2].projects_root == explicit.resolve()
    finally:
        for ctx in seen:
            ctx.supervisor.close()


# ------------------------------------------------------------ the built app

def _component(app, elem_id):
    (found,) = [b for b in app.blocks.values() if getattr(b, "elem_id", None) == elem_id]
    return found


def test_the_built_app_shows_the_root_control_locally_and_one_evaluate_default(ctx):
    from ui.app import build_app
    from ui.train_tab import SNAPSHOT_EVAL_DEFAULT
    shared = build_app(ctx)
    assert _component(shared, "root-btn").visible is False
    train_eval, output_eval = _component(shared, "train-snap-eval"), _component(shared, "output-snap-eval")
    assert train_eval.value == output_eval.value == SNAPSHOT_EVAL_DEFAULT
    assert _component(shared, "reset-confirm-row").visible is False and _component(shared, "reset-cancel")
    ctx.local = True
    assert _component(build_app(ctx), "root-btn").visible is True
