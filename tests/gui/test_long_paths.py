"""Names and paths longer than the filesystem allows, and other filesystem errors, typed into the Setup
tab's open / browse / create fields: one sentence in the banner, naming the field and the limit, no
traceback in the server's log, nothing created on disk; the project open now stays open."""
from __future__ import annotations

import errno
import html
import logging
import os
import re

import pytest
from gradio_client import Client

from trainer_core.project import Project
from ui import paths as ui_paths
from ui import setup_tab
from ui.app import serve

from .conftest import free_port

PACK = "t5xxl_pixart"


def limits(folder) -> tuple[int, int]:
    """What the filesystem itself says, asked here independently of ui.paths."""
    return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")


def tree(*roots) -> list[str]:
    """Every path under the allowed roots: compared before and after a refusal."""
    return sorted(str(p) for root in roots for p in root.rglob("*"))


def banner_text(html_banner: str) -> str:
    m = re.fullmatch(r'<div class="gt-banner gt-(?:error|notice)"[^>]*>(.*)</div>', html_banner, re.S)
    assert m, html_banner[:300]
    return html.unescape(m.group(1))


def act(ctx, action: str, text: str, current: str | None) -> tuple[str, str | None]:
    """(the banner's sentence, the project path the view keeps) after `action` with `text` in its field."""
    if action == "open":
        out = setup_tab.open_project(ctx, text, current)
    elif action == "create":
        out = setup_tab.create_project(ctx, "my_adapter", PACK, text, current)
    else:
        _, _, b = setup_tab.browse(ctx, text, "dir")
        return banner_text(b), current
    return banner_text(out[1]), out[0]


FIELD = {"open": "project folder", "browse": "folder", "create": "projects root"}


@pytest.fixture
def kept(ctx):
    """A project open in the GUI while the refused actions run; it must stay open."""
    return str(Project.create(ctx.projects_root / "kept", PACK).root)


@pytest.fixture
def no_traceback(caplog):
    caplog.set_level(logging.DEBUG)
    yield
    logged = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not logged, [r.getMessage()[:200] for r in logged]


@pytest.mark.parametrize("action", ["open", "browse", "create"])
def test_a_5000_character_component_is_one_sentence_naming_the_limit(ctx, kept, no_traceback, action):
    name_max, _ = limits(ctx.projects_root)
    text = str(ctx.projects_root / ("a" * 5000))
    before = tree(ctx.projects_root, ctx.demo_root)
    sentence, view = act(ctx, action, text, kept)
    assert sentence == (f"The {FIELD[action]} path has a component of 5000 characters; this filesystem allows at "
                        f"most {name_max} — choose a shorter name.")
    assert view == kept                                   # the project open stays open
    assert tree(ctx.projects_root, ctx.demo_root) == before


@pytest.mark.parametrize("action", ["open", "browse", "create"])
def test_30_components_of_250_characters_are_one_sentence_naming_the_limit(ctx, kept, no_traceback, action):
    _, path_max = limits(ctx.projects_root)
    text = os.path.join(str(ctx.projects_root), *(["b" * 250] * 30))
    before = tree(ctx.projects_root, ctx.demo_root)
    sentence, view = act(ctx, action, text, kept)
    assert sentence == (f"The {FIELD[action]} path is {len(text)} characters long; this filesystem allows at most "
                        f"{path_max - 1} — choose a shorter path.")
    assert view == kept
    assert tree(ctx.projects_root, ctx.demo_root) == before


@pytest.mark.parametrize("length", [300, 5000])
def test_an_adapter_name_longer_than_a_file_name_is_refused_before_anything_is_written(ctx, kept, no_traceback,
                                                                                         length):
    name_max, _ = limits(ctx.projects_root)
    before = tree(ctx.projects_root, ctx.demo_root)
    out = setup_tab.create_project(ctx, "c" * length, PACK, str(ctx.projects_root), kept)
    assert banner_text(out[1]) == (f"The adapter name has {length} characters; this filesystem allows at most "
                                   f"{name_max} — choose a shorter name.")
    assert out[0] == kept
    assert tree(ctx.projects_root, ctx.demo_root) == before


def test_a_projects_root_inside_the_limits_but_too_long_with_the_name_creates_nothing(ctx, no_traceback):
    """The root alone fits; root/name does not: refused as the project folder, no root folders made."""
    _, path_max = limits(ctx.projects_root)
    base = str(ctx.projects_root)
    parts = (path_max - 2 - len(base)) // 251           # as many 250-character folders as leave room for one more
    root = os.path.join(base, *(["d" * 250] * parts))
    name = "e" * (path_max - len(root) - 1)              # root/name: one character more than the filesystem allows
    assert len(root) < path_max - 1 and 1 <= len(name) <= 251
    before = tree(ctx.projects_root, ctx.demo_root)
    out = setup_tab.create_project(ctx, name, PACK, root)
    target = os.path.join(root, name)
    assert len(target) == path_max
    assert banner_text(out[1]) == (f"The project folder path is {len(target)} characters long; this filesystem "
                                   f"allows at most {path_max - 1} — choose a shorter path.")
    assert out[0] is None
    assert tree(ctx.projects_root, ctx.demo_root) == before


@pytest.mark.parametrize("action", ["open", "browse", "create"])
@pytest.mark.parametrize("shape", ["5000", "30x250"])
def test_a_long_path_outside_the_roots_is_still_refused_as_outside(ctx, tmp_path, no_traceback, action, shape):
    outside = tmp_path / "outside"
    outside.mkdir()
    text = str(outside / ("a" * 5000)) if shape == "5000" else os.path.join(str(outside), *(["b" * 250] * 30))
    sentence, _ = act(ctx, action, text, None)
    assert " is outside the folders this app may use (" in sentence and sentence.endswith("add a folder.")
    assert len(sentence) < 600                            # the path is quoted shortened, not 7,500 characters
    assert list(outside.iterdir()) == []


def test_the_limits_come_from_the_filesystem_with_a_fallback(ctx, monkeypatch, no_traceback):
    root = ctx.projects_root
    assert ui_paths.fs_limits(root) == limits(root)
    assert ui_paths.fs_limits(root / "not" / "yet") == limits(root)      # asked of the nearest existing folder
    # a filesystem that says 100: a 150-character name the real one would take is refused at 100
    real = os.pathconf
    monkeypatch.setattr(os, "pathconf", lambda p, n: 100 if n == "PC_NAME_MAX" else real(p, n))
    before = tree(root, ctx.demo_root)
    out = setup_tab.create_project(ctx, "f" * 150, PACK, str(root))
    assert banner_text(out[1]) == ("The adapter name has 150 characters; this filesystem allows at most 100 — "
                                   "choose a shorter name.")
    assert tree(root, ctx.demo_root) == before
    monkeypatch.delattr(os, "pathconf")                   # no pathconf at all (Windows): 255 and 4096
    assert ui_paths.fs_limits(root) == (255, 4096)
    sentence, _ = act(ctx, "open", str(root / ("g" * 300)), None)
    assert sentence == ("The project folder path has a component of 300 characters; this filesystem allows at "
                        "most 255 — choose a shorter name.")


def test_a_name_too_long_that_slips_past_the_limits_is_still_one_sentence(ctx, kept, monkeypatch, no_traceback):
    """If pathconf over-states the limits, the filesystem's own ENAMETOOLONG still becomes a sentence."""
    monkeypatch.setattr(ui_paths, "fs_limits", lambda path: (10 ** 6, 10 ** 6))
    text = str(ctx.projects_root / ("h" * 5000))
    before = tree(ctx.projects_root, ctx.demo_root)
    sentence, view = act(ctx, "open", text, kept)
    assert sentence == "The project folder path is too long for this filesystem; choose a shorter path."
    assert view == kept
    sentence, _ = act(ctx, "browse", text, kept)
    assert sentence.endswith("cannot be listed (File name too long).")
    out = setup_tab.create_project(ctx, "h" * 5000, PACK, str(ctx.projects_root), kept)
    assert banner_text(out[1]) == "The project folder path is too long for this filesystem; choose a shorter path."
    assert out[0] == kept
    assert tree(ctx.projects_root, ctx.demo_root) == before


@pytest.mark.parametrize("action", ["open", "browse", "create"])
def test_a_symlink_loop_is_one_sentence(ctx, kept, no_traceback, action):
    loop = ctx.projects_root / "loop"
    loop.symlink_to(loop)
    before = tree(ctx.projects_root, ctx.demo_root)
    sentence, view = act(ctx, action, str(loop / "inside"), kept)
    assert sentence == (f"The {FIELD[action]} path goes round a loop of symbolic links; remove the loop or choose "
                        f"another folder.")
    assert view == kept
    assert tree(ctx.projects_root, ctx.demo_root) == before


def test_a_symlink_loop_inside_a_listed_folder_is_left_out(ctx, no_traceback):
    (ctx.projects_root / "loop").symlink_to(ctx.projects_root / "loop")
    (ctx.projects_root / "real").mkdir()
    listed, entries, message = setup_tab.browse(ctx, str(ctx.projects_root), "any")
    assert message == "" and listed == str(ctx.projects_root)
    assert [value for _, value in entries["choices"] if value.startswith(str(ctx.projects_root) + os.sep)] == [
        str(ctx.projects_root / "real")]


def test_use_this_folder_as_the_projects_root_with_a_long_path_is_one_sentence(ctx, no_traceback):
    """The local app's fourth path field (ui/projects_root.py): refused, the root and roots unchanged."""
    from ui.projects_root import remembered_root
    ctx.local = True                                      # what `serve` sets on loopback without a login
    before = (ctx.projects_root, ctx.paths.roots, tree(ctx.projects_root, ctx.demo_root))
    for text in (str(ctx.projects_root / ("a" * 5000)), os.path.join(str(ctx.projects_root), *(["b" * 250] * 30))):
        out = setup_tab.change_root(ctx, text, None)
        assert banner_text(out[1]) == "The projects root path is too long for this filesystem; choose a shorter path."
        assert all(u == {"__type__": "update"} for u in out[-3:])
    assert (ctx.projects_root, ctx.paths.roots, tree(ctx.projects_root, ctx.demo_root)) == before
    assert remembered_root() is None


def test_permission_denied_is_one_sentence(ctx, kept, monkeypatch, no_traceback):
    """Simulated (the tests may run as root, whom permissions do not stop)."""
    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(ctx.projects_root / "locked"))
    monkeypatch.setattr(setup_tab.Project, "open", denied)
    monkeypatch.setattr(setup_tab.Project, "create", denied)
    monkeypatch.setattr(ctx.paths, "browse", denied)
    sentence = "The {} cannot be used: permission denied; choose a folder you may read and write."
    assert act(ctx, "open", str(ctx.projects_root / "locked"), kept)[0] == sentence.format("project folder")
    assert act(ctx, "browse", str(ctx.projects_root / "locked"), kept)[0] == sentence.format("folder")
    out = setup_tab.create_project(ctx, "locked", PACK, str(ctx.projects_root), kept)
    assert banner_text(out[1]) == sentence.format("project folder")


def test_nul_and_unencodable_names_are_refused(ctx, no_traceback):
    before = tree(ctx.projects_root, ctx.demo_root)
    out = setup_tab.create_project(ctx, "a\0b", PACK, str(ctx.projects_root))
    assert banner_text(out[1]) == "The adapter name holds a NUL character; type a plain name."
    out = setup_tab.create_project(ctx, "a\ud800b", PACK, str(ctx.projects_root))
    assert banner_text(out[1]) == ("The adapter name holds characters this system cannot use in a file name; "
                                   "type it with ordinary characters.")
    assert tree(ctx.projects_root, ctx.demo_root) == before


def test_the_running_app_answers_with_the_sentence_not_an_error(ctx, capfd, caplog):
    """The probe's way in: gradio_client against the served app; no AppError, no traceback logged."""
    caplog.set_level(logging.DEBUG)
    name_max, path_max = limits(ctx.projects_root)
    long_one = str(ctx.projects_root / ("a" * 5000))
    deep = os.path.join(str(ctx.projects_root), *(["b" * 250] * 30))
    before = tree(ctx.projects_root, ctx.demo_root)
    app, url = serve(ctx, port=free_port(), open_browser=False, block=False)
    try:
        client = Client(url, verbose=False)
        for text, tail in ((long_one, f"at most {name_max} — choose a shorter name."),
                           (deep, f"at most {path_max - 1} — choose a shorter path.")):
            assert banner_text(client.predict(text, api_name="/open_project")[0]).endswith(tail)
            assert banner_text(client.predict(text, "dir", api_name="/browse")[2]).endswith(tail)
            assert banner_text(client.predict("x", PACK, text, api_name="/create_project")[0]).endswith(tail)
        assert banner_text(client.predict("c" * 300, PACK, str(ctx.projects_root),
                                          api_name="/create_project")[0]).endswith(
            f"at most {name_max} — choose a shorter name.")
    finally:
        app.close()
    assert tree(ctx.projects_root, ctx.demo_root) == before
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "File name too long" not in out + err
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
