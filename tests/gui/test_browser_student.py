"""In a real browser (as tests/gui/test_browser.py): a new project has no student; Find on the Hub lists the
pig_clip GGUFs of the loopback stand-in Hub (tests/hub_server.py), Download selected fetches the f16 one as a
detached job, and the materials table shows the student ready — a real small pig_clip GGUF the student check
and the loader accept."""
from __future__ import annotations

import pytest

from hub_server import LocalHub, go_online
from student_files import student_gguf_bytes
from trainer_core.base.diskspace import human
from trainer_core.packs.lookup import resolve_material
from trainer_core.project import Project

from .test_browser import app_page, browser, shot  # noqa: F401 — the browser fixture

REPO_ID = "someone/pig_clip-GGUF"
STUDENT_ROW = "pig_clip student GGUF"


@pytest.fixture
def repos():
    return {REPO_ID: {"pig_clip-q8_0.gguf": student_gguf_bytes("q8_0"), "pig_clip-f16.gguf": student_gguf_bytes(),
                      "README.md": b"# pig_clip"}}


@pytest.fixture
def hub(repos, monkeypatch):
    with LocalHub(repos) as h:
        go_online(monkeypatch, h.url)                       # the app and its download job use it
        yield h


def test_a_new_project_finds_its_student_on_the_hub_and_it_becomes_ready(ctx, browser, hub, repos):  # noqa: F811
    from playwright.sync_api import expect
    with app_page(ctx, browser) as page:
        page.get_by_role("button", name="+ New project").click()
        page.locator("#new-name").get_by_role("textbox").fill("real")
        page.locator("#create-btn").click()
        root = (ctx.projects_root / "real").resolve()
        expect(page.locator("#project-title")).to_contain_text(str(root), timeout=60_000)
        row = page.locator("#materials").get_by_role("row").filter(has_text=STUDENT_ROW)
        expect(row).to_contain_text("missing", timeout=60_000)
        expect(page.locator("#materials-summary")).to_contain_text("Find on the Hub")
        expect(page.locator("#student-about")).to_contain_text("0.6B Qwen3 text model")

        page.locator("#student-find").click()
        expect(page.locator("#banner")).to_contain_text("Found 2 pig_clip GGUFs", timeout=60_000)
        chosen = page.locator("#student-found input")              # f16 first, chosen: repo, file, size, what for
        f16 = repos[REPO_ID]["pig_clip-f16.gguf"]
        expect(chosen).to_have_value(f"{REPO_ID} · pig_clip-f16.gguf · {human(len(f16))} · f16: train on this one")
        expect(page.locator("#student-download")).to_be_enabled()

        page.locator("#student-download").click()
        expect(page.locator("#banner")).to_contain_text("Download of pig_clip-f16.gguf", timeout=60_000)
        expect(row).to_contain_text("ready", timeout=120_000)            # the job's check passed, the tick shows it
        expect(row).to_contain_text(str(root / "materials" / "pig_clip-f16.gguf"))
        # the whole table is in view, every column: long paths and notes wrap inside their cells instead of
        # running the table out of its box (issue 56 item 10: "where" was cut, "note" out of sight)
        clipped = page.locator("#materials").evaluate(
            "t => [t, ...t.querySelectorAll('*')].filter(e => e.scrollWidth > e.clientWidth + 1"
            " && ['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(e).overflowX))"
            ".map(e => `${e.tagName}.${e.className}: ${e.scrollWidth} > ${e.clientWidth}`)")
        assert clipped == [], clipped
        shot(page, "setup-student-from-hub")
    target = resolve_material(Project.open(root), "student")
    assert target == root / "materials" / "pig_clip-f16.gguf" and target.read_bytes() == f16
    assert any(q.path.endswith("/resolve/main/pig_clip-f16.gguf") for q in hub.requests)
