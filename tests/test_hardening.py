"""Issue 18 (hardening): a damaged state.json or shard, leftover temp files and small CLI faults
each end in one clear outcome, never a traceback or a stuck project."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, copy_project, demo_with_corpus
from trainer_core.base.config import settings_from_dict
from trainer_core.base.errors import ConfigError, TrainerError
from trainer_core.base.events import ListReport, parse_event
from trainer_core.contract.shards import shard_intact, valid_shards
from trainer_core.packs import DEFAULT_PACK, PACKS
from trainer_core.project import Project, new_state, repair_state
from trainer_core.stages import export, precompute, stage_done
from trainer_core.status import status_report

DAMAGED_STATES = {
    "stages a string": '{"status": "running", "stages": "x"}',
    "a list": "[1, 2, 3]",
    "garbage": "\x00\x01 not json {",
    "a stage entry a string": '{"status": "done", "stages": {"corpus": "x", "train": {"status": ["x"], "count": 3}}}',
    "null": "null",
}


@pytest.fixture
def project(tmp_path):
    return Project.create(tmp_path / "p", "t5xxl_pixart")


def warnings_in(project: Project) -> list[str]:
    if not project.events_jsonl.is_file():
        return []
    events = [parse_event(line) for line in project.events_jsonl.read_text("utf-8").splitlines()]
    return [e["payload"]["message"] for e in events
            if e and e["type"] == "log" and e["payload"].get("level") == "warning"]


# ---------------------------------------------------------------- state.json

@pytest.mark.parametrize("text", DAMAGED_STATES.values(), ids=DAMAGED_STATES.keys())
def test_a_damaged_state_is_rebuilt_once_with_one_warning(project, text):
    project.state_json.write_text(text, encoding="utf-8")
    for _ in range(3):
        state = project.read_state()
        assert isinstance(state["stages"], dict) and all(isinstance(e, dict) for e in state["stages"].values())
        assert isinstance(state["status"], str)
    report = status_report(project)                            # the GUI's and `status`'s view
    assert [s["status"] for s in report["stages"]] == ["-"] * 6
    warnings = warnings_in(project)
    assert len(warnings) == 1 and warnings[0].startswith("state.json was damaged")
    assert repair_state(json.loads(project.state_json.read_text()))[1] == []      # written back valid


def test_repair_keeps_what_is_valid():
    state, problems = repair_state({"status": "stopped", "error": 3, "run": "r1", "stages": {
        "train": {"status": "stopped", "step": 40, "eta_s": "soon", "loss": 0.5}, "export": 7}})
    assert state["status"] == "stopped" and state["error"] is None and state["run"] == "r1"
    assert state["stages"] == {"train": {"status": "stopped", "step": 40, "loss": 0.5}}
    assert len(problems) == 3
    assert repair_state(new_state()) == (new_state(), [])


@pytest.mark.parametrize("text", [DAMAGED_STATES["stages a string"], DAMAGED_STATES["a list"]])
def test_status_and_run_work_on_a_damaged_state(tmp_path, run_cli, text):
    root = demo_with_corpus(tmp_path / "demo")
    (root / "state.json").write_text(text, encoding="utf-8")
    for args in (("status",), ("status", "--json")):
        r = run_cli(*args, "--project", str(root))
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(run_cli("status", "--json", "--project", str(root)).stdout)["status"] in ("idle", "interrupted")
    (root / "state.json").write_text(text, encoding="utf-8")
    r = run_cli("run", "--project", str(root), "--only", "corpus")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    state = Project.open(root).read_state()
    assert state["status"] == "done" and state["stages"]["corpus"]["status"] == "done"
    r = run_cli("status", "--project", str(root))
    assert r.returncode == 0 and ": done" in r.stdout.splitlines()[0]


# ---------------------------------------------------------------- shards

@pytest.fixture(scope="module")
def shards_template(tmp_path_factory):
    root = demo_with_corpus(tmp_path_factory.mktemp("demo") / "t5_adapter")
    assert precompute.run(Project.open(root), ListReport(), split="val") == "done"
    return root


def test_a_truncated_or_overwritten_shard_is_not_done_and_is_computed_again(shards_template, tmp_path):
    demo = copy_project(shards_template, tmp_path)
    assert stage_done(demo, "precompute_val")
    shard = valid_shards(demo, "val")[0]
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) - 100])               # the data cut short
    assert not shard_intact(shard) and not stage_done(demo, "precompute_val")
    report = ListReport()
    assert precompute.run(demo, report, split="val") == "done"
    assert any("damaged" in e["message"] and shard.name in e["message"]
               for e in report.of_type("log") if e.get("level") == "warning")
    assert shard_intact(shard) and stage_done(demo, "precompute_val") and len(shard.read_bytes()) == len(whole)
    for bad in (b"\xff" * 64, whole[:8] + b"{not json" + whole[17:], b"\x01\x00"):
        shard.write_bytes(bad)
        assert not shard_intact(shard) and not stage_done(demo, "precompute_val")
    assert status_report(demo)["stages"][1]["done"] is False          # status does not trip over it


# ---------------------------------------------------------------- export temps

def test_the_export_stage_removes_the_temps_of_its_own_outputs_only(project, tmp_path):
    copy_to = tmp_path / "models"
    copy_to.mkdir()
    project.update_settings([f"export.copy_to={copy_to}"])
    out, name = project.output_dir(), project.settings.name
    mine = [out / f".{name}-f16.gguf.a1b2c3.tmp", copy_to / f".{name}-f16.gguf.zz.tmp"]
    others = [out / f".{name}-step40-f16.gguf.q9.tmp",          # a snapshot job's: left to the job
              out / ".pig_other-f16.gguf.x1.tmp", out / f"{name}-f16.gguf.tmp"]
    for path in mine + others:
        path.write_bytes(b"\x00" * 4096)
    report = ListReport()
    with pytest.raises(TrainerError, match="nothing to export"):
        export.run(Project.open(project.root), report)
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)
    assert "removed 2 temp file(s)" in report.of_type("log")[0]["message"]


# ---------------------------------------------------------------- small ones

def test_a_closed_stdout_ends_the_cli_quietly(project):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "trainer_core", "status", "--json", "--project",
                             str(project.root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()                    # what `| head -1` does once it has its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_bad_checkpoint_name_is_bad_input(project, run_cli):
    for extra in ((), ("--detach",)):
        r = run_cli("snapshot", "--project", str(project.root), "--checkpoint", "nope", *extra)
        assert r.returncode == 2 and "is not a checkpoint" in r.stderr, (r.returncode, r.stderr)


def test_train_steps_is_capped_at_ten_million(project, run_cli):
    r = run_cli("set", "--project", str(project.root), "--steps", "99999999999999999999999")
    assert r.returncode == 2 and "train.steps must be at most 10,000,000" in r.stderr, r.stderr
    assert Project.open(project.root).settings.train.steps == project.settings.train.steps
    assert settings_from_dict({"train": {"steps": "10M"}}, PACKS, DEFAULT_PACK).train.steps == 10_000_000
    with pytest.raises(ConfigError, match="at most 10,000,000"):
        settings_from_dict({"train": {"steps": 10_000_001}}, PACKS, DEFAULT_PACK)
