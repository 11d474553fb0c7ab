"""In a real browser (as tests/gui/test_browser.py): with no project open the Setup form is hidden and
Calibrate / Save are off; a project created in the app stays the app's project through a page reload,
even after a CLI command in a terminal made another project the CLI's last one."""
from __future__ import annotations

from pathlib import Path

from trainer_core.project import Project, last_project

from .test_browser import app_page, browser, shot  # noqa: F401 — the browser fixture

PACK = "t5xxl_pixart"


def test_a_reload_after_a_cli_command_keeps_the_apps_own_project(ctx, browser, run_cli):  # noqa: F811
    from playwright.sync_api import expect
    with app_page(ctx, browser) as page:

        # nothing open: the form is hidden behind its note, Calibrate and Save are off
        expect(page.locator("#no-project-note")).to_contain_text("No project open", timeout=60_000)
        expect(page.locator("#settings-form")).to_be_hidden()
        expect(page.locator("#calibrate-btn")).to_be_disabled()
        expect(page.locator("#save-btn")).to_be_disabled()
        shot(page, "setup-no-project")

        # the user creates a project in the app
        page.get_by_role("button", name="+ New project").click()
        page.locator("#new-name").get_by_role("textbox").fill("mine")
        page.locator("#create-btn").click()
        mine = (ctx.projects_root / "mine").resolve()
        title = page.locator("#project-title")
        expect(title).to_contain_text(str(mine), timeout=60_000)
        steps = str(Project.open(mine).settings.train.steps)
        expect(page.locator("#set-train-steps").get_by_role("textbox")).to_have_value(steps, timeout=30_000)
        expect(page.locator("#no-project-note")).to_be_hidden()
        expect(page.locator("#calibrate-btn")).to_be_enabled()
        expect(page.locator("#save-btn")).to_be_enabled()

        # meanwhile, in a terminal: another project, which becomes the CLI's last project
        other = ctx.projects_root / "other"
        r = run_cli("new", "--project", str(other), "--pack", PACK)
        assert r.returncode == 0, r.stderr
        assert last_project() == other.resolve()

        page.reload()
        page.get_by_role("tab", name="Setup").wait_for()
        expect(title).to_contain_text(str(mine), timeout=60_000)          # the page load's answer has come …
        assert str(other.resolve()) not in title.inner_text()             # … and it is the app's project
        expect(page.locator("#set-train-steps").get_by_role("textbox")).to_have_value(steps)
        expect(page.locator("#save-btn")).to_be_enabled()
        expect(page.locator("#banner")).not_to_contain_text("No project open")

        # the other tabs act on it too: Export snapshot answers about this project, not "Open … first"
        page.get_by_role("tab", name="Output").click()
        page.locator("#output-snapshot").click()
        expect(page.locator("#banner")).to_contain_text("no checkpoint to export yet", timeout=60_000)
        page.get_by_role("tab", name="Setup").click()
        shot(page, "setup-after-reload")
    assert Path(ctx.project) == mine


def test_the_demo_button_on_a_complete_demo_offers_to_start_it_afresh(ctx, browser, monkeypatch):  # noqa: F811
    import shutil

    import demo_cache
    from playwright.sync_api import expect
    from ui.setup_tab import AFRESH_LABEL
    source = demo_cache.trained(PACK)                                    # a demo that has run every stage
    shutil.copytree(source.parent, ctx.demo_root, symlinks=True, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(".complete"))
    demo = ctx.demo_root / source.name
    (demo / "marker").write_text("the old run")
    started = []
    monkeypatch.setattr(ctx.supervisor, "start_run", lambda root: started.append(root) or 4242)
    with app_page(ctx, browser) as page:
        afresh = page.locator("#demo-afresh")
        expect(afresh).to_be_hidden()
        page.locator("#demo-btn").click()
        expect(page.locator("#banner")).to_contain_text("already done", timeout=60_000)
        expect(page.locator("#project-title")).to_contain_text(str(demo))
        expect(afresh).to_be_visible()
        expect(afresh).to_have_text(AFRESH_LABEL)
        assert started == [] and (demo / "marker").is_file()
        shot(page, "setup-demo-done")

        afresh.click()
        expect(page.locator("#banner")).to_contain_text("Rebuilt the demo", timeout=120_000)
        expect(afresh).to_be_hidden()
        assert started == [demo] and not (demo / "marker").exists() and (demo / "project.json").is_file()
