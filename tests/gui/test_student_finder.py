"""The student section's handlers (ui/student_finder.py) without a browser: a file you have is checked before it
becomes the student, a file outside the app's folders is refused, and Find on the Hub without a Hub says so in
its banner at once."""
from __future__ import annotations

import html

from student_files import student_gguf_bytes
from trainer_core.packs.lookup import resolve_material
from trainer_core.project import Project
from ui import materials_panel, student_finder

from .conftest import free_port


def _banner_text(update: str) -> str:
    return html.unescape(update)


def test_a_file_you_have_is_checked_then_linked(ctx, tmp_path):
    project = Project.create(ctx.projects_root / "mine", "t5xxl_pixart")
    adapter = ctx.projects_root / "pig_clip-f16.gguf"           # named like one, but not a GGUF at all
    adapter.write_bytes(b"GGUF" + bytes(3000))
    banner, table, *_ = student_finder.use_file(ctx.paths, str(project.root), str(adapter), None,
                                                materials_panel.refresh)
    assert "cannot be the student" in _banner_text(banner) and "gt-error" in banner
    assert resolve_material(Project.open(project.root), "student") is None

    outside = tmp_path / "elsewhere" / "pig_clip-f16.gguf"
    outside.parent.mkdir()
    outside.write_bytes(student_gguf_bytes())
    banner, *_ = student_finder.use_file(ctx.paths, str(project.root), str(outside), None, materials_panel.refresh)
    assert "outside the folders this app may use" in _banner_text(banner)

    mine = ctx.projects_root / "pig_clip-q8_0.gguf"
    mine.write_bytes(student_gguf_bytes("q8_0"))
    banner, table, *_ = student_finder.use_file(ctx.paths, str(project.root), str(mine), None,
                                                materials_panel.refresh)
    assert f"The student is now {mine}" in _banner_text(banner)
    assert resolve_material(Project.open(project.root), "student") == mine
    row = next(r for r in table["value"] if r[0] == "pig_clip student GGUF")
    assert row[2] == "ready" and "q8_0: quantized, for running; train on f16" in row[5]


def test_find_without_the_hub_is_one_sentence_in_the_banner(ctx, monkeypatch):
    import huggingface_hub.constants as constants
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")          # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    project = Project.create(ctx.projects_root / "mine", "t5xxl_pixart")
    banner, found, download = student_finder.find(str(project.root))
    assert "cannot be reached" in _banner_text(banner) and "gt-error" in banner
    assert found["choices"] == [] and download["interactive"] is False
