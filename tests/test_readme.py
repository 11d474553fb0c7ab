"""Issue 56 item 10: the README stays short (what, two commands, first real project, links) and the rest lives in
docs/. These checks read text files only: no torch, no Gradio."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The files whose relative links (and #anchors into Markdown files) must resolve.
LINKED = [README, ROOT / "docs" / "GUIDE.md", ROOT / "docs" / "DEVELOPMENT.md"]
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _fenced_lines(text: str) -> list[str]:
    return [line for block in FENCE.findall(text) for line in block.splitlines()[1:-1]]


def _inline_spans(text: str) -> list[str]:
    """Inline code spans outside fenced blocks, as written (a span never crosses a blank line)."""
    spans = []
    for para in re.split(r"\n[ \t]*\n", FENCE.sub("", text)):
        spans += [m.group(2) for m in re.finditer(r"(`+)(.+?)\1", para, re.S)]
    return spans


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", _text(path))
    return {_slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def test_the_readme_test_command_is_what_ci_runs():
    ci = [line for line in _text(ROOT / ".ci" / "run").splitlines() if line.startswith("python3 -m venv")]
    readme = [line for line in _fenced_lines(_text(README)) if line.startswith("python3 -m venv") and "pytest" in line]
    assert len(ci) == 1 and readme == ci


def test_the_readme_is_short_and_has_its_parts():
    text = _text(README)
    headings = re.findall(r"^##\s+(.+?)\s*$", text, re.M)
    assert "Two commands" in headings and "Read more" in headings
    assert "<!-- first-real-project -->" in text or "Your first real project" in headings
    assert len(text.split()) <= 900


def test_no_engine_command_wraps_inside_prose():
    """Every `ggk diffuser engine …` command is in a fenced block or fits on one line of an inline span."""
    wrapped = [f"{path.relative_to(ROOT)}: {' '.join(span.split())[:80]}"
               for path in [README, *sorted((ROOT / "docs").glob("*.md"))]
               for span in _inline_spans(_text(path))
               if "\n" in span and "ggk diffuser engine" in " ".join(span.split())]
    assert not wrapped


def test_relative_links_resolve():
    broken = []
    for path in LINKED:
        for target in LINK.findall(_text(path)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):      # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.is_file():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{path.relative_to(ROOT)} -> {target} (no such heading)")
    assert not broken
