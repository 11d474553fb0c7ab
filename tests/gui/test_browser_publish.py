"""The Output tab's Publish to the Hub panel in a real browser, against the loopback Hub (tests/hub_server.py), on a
copy of the session's trained PixArt demo (tests/demo_cache.py)."""
from __future__ import annotations

import demo_cache
from hub_server import LocalHub
from trainer_core.base import token_store
from trainer_core.project import Project
from trainer_core.publish import planned_files

from .test_browser import app_page, browser, shot  # noqa: F401 — the browser fixture

TOKEN = "hf_browser_publish_token_77"
REPO = "someone/pig-t5-from-the-gui"


def test_the_publish_panel_lists_the_files_then_publishes_them(ctx, browser, monkeypatch):  # noqa: F811
    import huggingface_hub.constants as constants
    from playwright.sync_api import expect
    project = Project.open(demo_cache.copy_trained("t5xxl_pixart", ctx.projects_root))
    token_store.write_token(project.root, TOKEN)
    files = planned_files(project)
    with LocalHub({}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)       # the library's plain LFS path
        with app_page(ctx, browser) as page:
            page.locator("#open-path").get_by_role("textbox").fill(str(project.root))
            page.locator("#open-btn").click()
            expect(page.locator("#project-title")).to_contain_text(str(project.root), timeout=60_000)
            page.get_by_role("tab", name="Output").click()
            repo = page.locator("#publish-repo").get_by_role("textbox")
            expect(repo).to_have_value(project.settings.name, timeout=30_000)      # pre-filled from the project
            expect(page.locator("#publish-private input")).to_be_checked()          # private by default
            expect(page.locator("#publish-btn")).to_be_disabled()
            repo.fill(REPO)
            page.locator("#publish-allow-demo input").check()                       # a demo: a machinery check
            page.locator("#publish-review").click()
            status = page.locator("#publish-status")
            for f in files:                                                          # exactly what will go up
                expect(status).to_contain_text(f.in_repo, timeout=30_000)
            expect(status).to_contain_text(f"These {len(files)} files")
            shot(page, "output-publish-review")
            page.locator("#publish-btn").click()
            expect(status).to_contain_text(f"Published {len(files)} files to {REPO}", timeout=60_000)
            shot(page, "output-publish-done")
        assert hub.repo_files(REPO) == {f.in_repo: f.local.read_bytes() for f in files}
        (commit,) = hub.commits[REPO]
        assert commit["private"] is True


def test_the_panel_shows_a_refusal_in_the_panel_and_keeps_publish_off(ctx, tmp_path):
    """Without a browser: a bad repo name at the review, and a publish without a token, are one sentence each in
    the panel's status, with Publish off."""
    from ui.publish_panel import review_publish, run_publish
    project = Project.open(demo_cache.copy_trained("t5xxl_pixart", ctx.projects_root))
    status, button = review_publish(ctx, str(project.root), "bad name!", True, False)
    assert "not a Hub repo name" in status and button["interactive"] is False
    status, button = review_publish(ctx, str(project.root), REPO, True, False)
    assert "README.md" in status and button["interactive"] is True
    *_, (status, button) = run_publish(ctx, str(project.root), REPO, True, False, True)
    assert "no Hugging Face token" in status and button["interactive"] is False
