"""Bad input gets one clear sentence naming the field or file, a non-zero exit code, and
nothing on disk is modified (a failed pipeline run only records its failure: state.json,
events.jsonl and pipeline.log)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from conftest import write_prompts

RUN_RECORDS = {"state.json", "events.jsonl", "pipeline.log", ".run.lock"}


@dataclass
class Case:
    id: str
    args: list[str]                      # CLI arguments; {project} and {tmp} are filled in
    code: int
    message: str                         # must appear in stderr (or stdout for pipeline runs)
    setup: Callable[[Path, Path], None] | None = None   # (project, tmp) -> None
    may_change: set[str] = field(default_factory=set)   # files a failed run may record into
    ran: bool = False                    # refused by the pipeline's stage (its log and state), not up front


def _not_json(project: Path, tmp: Path) -> None:
    (project / "project.json").write_text('{"pack": "llada_image",\n  "train": {"steps": 5,}\n}')


def _bad_setting_in_file(project: Path, tmp: Path) -> None:
    data = json.loads((project / "project.json").read_text())
    data["train"]["steps"] = "abc"
    (project / "project.json").write_text(json.dumps(data))


def _prompt_file(content: bytes, name: str = "bad.txt") -> Callable[[Path, Path], None]:
    def setup(project: Path, tmp: Path) -> None:
        (tmp / name).write_bytes(content)
        data = json.loads((project / "project.json").read_text())
        data["corpus"].update(presets=[], extra_files=[str(tmp / name)], n_val=5)
        (project / "project.json").write_text(json.dumps(data))
    return setup


def _missing_prompt_file(project: Path, tmp: Path) -> None:
    data = json.loads((project / "project.json").read_text())
    data["corpus"].update(presets=[], extra_files=[str(tmp / "nowhere.txt")])
    (project / "project.json").write_text(json.dumps(data))


def _too_few_prompts(project: Path, tmp: Path) -> None:
    write_prompts(tmp / "few.txt", 50)
    data = json.loads((project / "project.json").read_text())
    data["corpus"].update(presets=[], extra_files=[str(tmp / "few.txt")], n_val=40)
    (project / "project.json").write_text(json.dumps(data))


def _plain_folder(project: Path, tmp: Path) -> None:
    (tmp / "plain").mkdir()
    (tmp / "plain" / "notes.txt").write_text("not a project")


SET = ["set", "--project", "{project}"]
CASES = [
    Case("steps-word", SET + ["--steps", "abc"], 2, 'train.steps must be a positive whole number, got "abc"'),
    Case("steps-zero", SET + ["--steps", "0"], 2, 'train.steps must be a positive whole number, got "0"'),
    Case("steps-negative", SET + ["--steps", "-5"], 2, 'train.steps must be a positive whole number, got "-5"'),
    Case("steps-fraction", SET + ["--steps", "1.2345k"], 2, 'train.steps must be a positive whole number, got "1.2345k"'),
    Case("steps-nan", SET + ["--steps", "nan"], 2, 'train.steps must be a positive whole number, got "nan"'),
    Case("steps-bad-commas", SET + ["--steps", "12,00"], 2, 'train.steps must be a positive whole number, got "12,00"'),
    Case("unknown-key-typo", SET + ["--set", "train.stesp=5"], 2, '"train.stesp" is not a setting (did you mean "train.steps"?)'),
    Case("unknown-top-key", SET + ["--set", "foo=1"], 2, '"foo" is not a setting'),
    Case("unknown-section", SET + ["--set", "trian.steps=1"], 2, '"trian.steps" is not a setting'),
    Case("not-an-assignment", SET + ["--set", "train.steps"], 2, '"train.steps" is not a setting assignment; write it as key=value'),
    Case("lr-word", SET + ["--set", "train.lr=abc"], 2, 'train.lr must be a number greater than 0, got "abc"'),
    Case("bool-word", SET + ["--set", "export.run_eval=maybe"], 2, 'export.run_eval must be true or false, got "maybe"'),
    Case("width-not-64", SET + ["--set", "train.width=100"], 2, 'train.width must be a multiple of 64, got "100"'),
    Case("unknown-preset", SET + ["--set", "corpus.presets=laion"], 2, 'corpus.presets must be a list drawn from'),
    Case("bad-device", SET + ["--set", "train.device=gpu0"], 2, 'train.device must be "auto", "cpu", "cuda" or "cuda:N", got "gpu0"'),
    Case("frac-range", SET + ["--set", "corpus.empty_frac=2"], 2, 'corpus.empty_frac must be a number from 0 to 0.5, got "2"'),
    Case("min-over-max", SET + ["--set", "corpus.min_chars=2000"], 2, "corpus.min_chars (2000) must not exceed corpus.max_chars (1200)"),
    Case("two-problems", SET + ["--set", "train.batch_size=x", "--set", "train.lr=-1"], 2,
         '2 settings are invalid: train.batch_size must be a positive whole number, got "x"; train.lr must be a number greater than 0, got "-1"'),
    Case("missing-project", ["status", "--project", "{tmp}/nowhere"], 2, "There is no project at"),
    Case("folder-not-project", ["run", "--project", "{tmp}/plain"], 2, "is not a gguf-trainer project (it has no project.json)",
         setup=_plain_folder),
    Case("unknown-pack", ["new", "--project", "{tmp}/other", "--pack", "sdxl_clip"], 2, 'There is no trainer pack "sdxl_clip"'),
    Case("mistyped-pack", ["new", "--project", "{tmp}/other", "--pack", "pixart"], 2,
         'There is no trainer pack "pixart"; did you mean t5xxl_pixart? Choose one of: '),
    Case("mistyped-demo-pack", ["demo", "--project", "{tmp}/other", "--pack", "mageflo"], 2,
         'There is no trainer pack "mageflo"; did you mean qwen3vl_mageflow? Choose one of: '),
    Case("existing-project", ["new", "--project", "{project}", "--pack", "t5xxl_pixart"], 2, "is already a project (pack llada_image)"),
    Case("bad-name", ["new", "--project", "{tmp}/other", "--pack", "llada_image", "--name", "a/b"], 2,
         'name must be a file name made of letters, digits, ".", "_" and "-", got "a/b"'),
    Case("unknown-stage", ["run", "--project", "{project}", "--only", "corpsu"], 2, '--only got unknown stage "corpsu"'),
    Case("project-json-not-json", ["status", "--project", "{project}"], 2, "project.json is not valid JSON (line 2", setup=_not_json),
    Case("project-json-bad-value", ["start", "--project", "{project}"], 2,
         'project.json: train.steps must be a positive whole number, got "abc"', setup=_bad_setting_in_file),
    Case("prompt-file-not-utf8", ["run", "--project", "{project}", "--only", "corpus"], 2,
         "bad.txt line 2 is not UTF-8 text", setup=_prompt_file(b"a fine prompt\nbad \xff\xfe bytes\n"),
         may_change=RUN_RECORDS, ran=True),
    Case("prompt-jsonl-not-json", ["run", "--project", "{project}", "--only", "corpus"], 2,
         "bad.jsonl line 2 is not valid JSON", setup=_prompt_file(b'{"text": "ok prompt here"}\n{text: 1}\n', "bad.jsonl"),
         may_change=RUN_RECORDS, ran=True),
    Case("prompt-file-missing", ["run", "--project", "{project}", "--only", "corpus"], 2,
         "nowhere.txt (corpus.extra_files) does not exist", setup=_missing_prompt_file, may_change=RUN_RECORDS, ran=True),
    Case("too-few-prompts", ["run", "--project", "{project}", "--only", "corpus"], 2,
         "The corpus has 50 usable prompts but needs at least 140", setup=_too_few_prompts, may_change=RUN_RECORDS, ran=True),
]


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    out = {}
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_fifo():
            out[str(path.relative_to(folder))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path, run_cli):
    project = tmp_path / "llada_adapter"
    assert run_cli("new", "--project", str(project), "--pack", "llada_image").returncode == 0
    if case.setup:
        case.setup(project, tmp_path)
    before = snapshot(tmp_path)
    args = [a.format(project=project, tmp=tmp_path) for a in case.args]
    r = run_cli(*args)
    assert r.returncode == case.code, r.stdout + r.stderr
    if not case.ran:  # rejected up front: one sentence on stderr, nothing else
        assert case.message in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert r.stdout == ""
    else:  # the pipeline ran and its stage refused: the message is in its log, on the terminal and in the state
        assert case.message in r.stdout
        state = json.loads((project / "state.json").read_text())
        assert state["status"] == "failed" and case.message in state["error"]
        assert "Traceback" not in (project / "pipeline.log").read_text()
    after = snapshot(tmp_path)
    changed = {k for k in before.keys() | after.keys()
               if before.get(k) != after.get(k)}
    changed = {k for k in changed if Path(k).name not in case.may_change or not k.startswith(project.name + os.sep)}
    assert changed == set(), f"files changed: {sorted(changed)}"


def test_there_are_at_least_twenty_cases():
    assert len(CASES) >= 20
