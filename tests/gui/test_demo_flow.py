"""The demo buttons' streamed answers (ui/demo_flow.py demo_steps): each step of the build reaches the page in
the banner while the build goes on, then the button's own answer; no real build here (test_app_project.py and
the browser test build real demos)."""
from __future__ import annotations

import threading

import pytest

from ui.demo_flow import BUILDING, demo_steps
from ui.project_view import ProjectView


def test_each_step_is_in_the_banner_while_the_build_goes_on_then_the_answer(ctx):
    first_seen = threading.Event()
    waited: list[bool] = []

    def build(progress):
        progress(0, 5, "loading torch and transformers")
        waited.append(first_seen.wait(60))           # the page has the first step before the build goes on
        progress(2, 5, "the student GGUF")
        return ProjectView.of(ctx, None, "done")

    answers = demo_steps(build)
    first = next(answers)
    first_seen.set()
    rest = list(answers)
    final = ProjectView.of(ctx, None, "done")
    assert waited == [True] and len(rest) == 2
    steps = [first, rest[0]]
    assert [len(s) for s in steps] == [len(final)] * 2
    assert f"{BUILDING} (0/5): loading torch and transformers…" in steps[0][1]
    assert f"{BUILDING} (2/5): the student GGUF…" in steps[1][1]
    skip = ProjectView.banner_only("x")[0]
    assert all(s[i] == skip for s in steps for i in range(len(s)) if i != 1)     # only the banner changes
    assert rest[1][0] is None and "done" in rest[1][1]


def test_a_bug_in_the_build_is_raised_by_the_handler():
    def build(progress):
        progress(0, 5, "loading torch and transformers")
        raise RuntimeError("a bug")

    answers = demo_steps(build)
    assert BUILDING in next(answers)[1]
    with pytest.raises(RuntimeError, match="a bug"):
        next(answers)
