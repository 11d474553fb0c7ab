"""The command line's help and its answers to a new user (issue 19, item 9): every `--project`
described, the stage names `--only` takes, what each reset deletes, `--auto-resume` at the top,
a typo'd command answered with the nearest one, and a boot-script resume that says why it did
nothing."""
from __future__ import annotations

import pytest

from trainer_core import cli
from trainer_core.project import Project, remember_last_project
from trainer_core.resets import RESETS
from trainer_core.stages import STAGE_NAMES


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        cli.parse_args([*argv, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())      # argparse wraps lines: compare words


@pytest.mark.parametrize("command", ["run", "start"])
def test_only_lists_the_stage_names(capsys, command):
    text = _help(capsys, command)
    assert "run only these stages; the stages, in order: " + ", ".join(STAGE_NAMES) in text
    assert "--project DIR the project folder" in text


def test_reset_says_what_each_target_deletes(capsys):
    text = _help(capsys, "reset")
    for what, deletes in (("state", "state.json only"), ("train", "checkpoints/, eval.json"),
                          ("shards", "shards/ + train"), ("corpus", "data/ + shards + train"),
                          ("output", "this project's exported GGUFs")):
        assert f"{what} {deletes}" in text
    assert "{" + ",".join(RESETS) + "}" in text and "Materials are never touched." in text


def test_every_project_option_is_described(capsys):
    undescribed = []
    for command in cli.SUBCOMMANDS:
        text = _help(capsys, command)
        if "--project DIR" in text and "--project DIR the " not in text and "--project DIR default:" not in text:
            undescribed.append(command)
    assert undescribed == []


def test_the_top_level_help_names_auto_resume(capsys):
    text = _help(capsys)
    assert "gguf-trainer --auto-resume" in text and "--auto-resume --no-gui" in text


def test_a_typo_suggests_the_nearest_command(run_cli):
    r = run_cli("strat", "--project", "x")
    assert r.returncode == 2
    assert r.stderr.strip() == "gguf-trainer: 'strat' is not a command; did you mean 'start'?"
    far = run_cli("zzzz")
    assert far.returncode == 2 and "the commands are serve, download, new, run, start" in far.stderr


def test_auto_resume_without_a_gui_says_why_nothing_was_resumed(tmp_path, capsys):
    assert cli.main(["--auto-resume", "--no-gui"]) == 0
    assert capsys.readouterr().out.strip() == "nothing to resume: no project has been opened or run yet"
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    remember_last_project(project.root)
    assert cli.main(["--auto-resume", "--no-gui"]) == 0
    assert capsys.readouterr().out.strip() == (f"nothing to resume: the last project, {project.root}, is idle, "
                                               "not interrupted")
    project.update_settings(["auto_resume=false"])
    assert cli.main(["--auto-resume", "--no-gui"]) == 0
    assert capsys.readouterr().out.strip() == f"nothing to resume: auto_resume is off for {project.root}"
