"""The conformance suite: every check all packs share, over every pack discovery finds (the folders under
trainer_core/packs/ and the `gguf_trainer.packs` entry points), in the manner of transformers' common model tests.
A pack's own test file keeps only what is unique to it; a new pack gets these checks without a line edited here.

Each pack is checked on its demo (tests/demo_cache.py: built and taken through the whole pipeline once per
session, by the stage processes as the driver starts them):

* the run learned, and eval.json has the pack's metrics and a round trip through the GGUF;
* `gguf-trainer inspect` accepts the adapter and every file the export writes beside it;
* `gguf-trainer infer --project` equals an independent numpy reading of the file (tests/numpy_adapters.py) on the
  student rows the pack hands the engine;
* batched precompute equals one sample at a time (the targets, the student rows and the ids of every sample);
* the pack's teacher equals its own reference forward (`TrainerPack.reference_forward`, plain transformers),
  where the pack supplies one;
* the engine facts the bench harness reads agree with the pack's hooks;
* the default plan (no Calibrate) is within its bounds of the demo run (tests/plan_bounds.py);
* the demo exports the bytes recorded for this machine (tests/data/demo_hashes*.json, bench/demo_hashes.py), or,
  where none are recorded (another machine, a pack from outside), exporting the same checkpoint again writes the
  same bytes.

GGUF_TRAINER_CONFORMANCE=ID[,ID…] limits the suite to those packs (the run for a pack installed from outside the
repository, tests/test_pack_template.py).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import demo_cache
from conftest import cli_here
from demo_fingerprint import RECORDED, fingerprint, machine, recorded_for
from numpy_adapters import engine_forward, gguf_tensors
from plan_bounds import idle_seconds, within_bounds
from trainer_core.base.events import ListReport
from trainer_core.packs import DEMO_PACKS, PACKS, TrainerPack
from trainer_core.packs.lookup import engine_ids, require_material
from trainer_core.plan import make_plan
from trainer_core.project import Project

_ONLY = [p for p in os.environ.get("GGUF_TRAINER_CONFORMANCE", "").split(",") if p]
IDS = [p for p in DEMO_PACKS if not _ONLY or p in _ONLY]
REFERENCED = [p for p in IDS if PACKS[p].reference_forward is not None]
PROMPT = "a (red:1.3) fox in the snow, oil painting"
_HOMES = {id(m.PACK): name for name, m in list(sys.modules.items()) if isinstance(getattr(m, "PACK", None), TrainerPack)}
OURS = sorted(p for p in PACKS if _HOMES[id(PACKS[p])].startswith("trainer_core.packs."))   # this repository's packs


def test_every_pack_has_a_demo_the_suite_can_run():
    assert set(PACKS) == set(DEMO_PACKS)
    assert not _ONLY or set(_ONLY) <= set(IDS), f"GGUF_TRAINER_CONFORMANCE names unknown packs: {_ONLY}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """pack id → a copy of its trained demo project (the module's own, shared by its tests)."""
    made: dict[str, Project] = {}

    def get(pack_id: str) -> Project:
        if pack_id not in made:
            made[pack_id] = Project.open(demo_cache.copy_trained(pack_id, tmp_path_factory.mktemp(pack_id)))
        return made[pack_id]
    return get


@pytest.mark.parametrize("pack_id", IDS)
def test_the_demo_learns_and_evaluates_its_export(pack_id, trained):
    project, pack = trained(pack_id), PACKS[pack_id]
    ev = json.loads(project.eval_json.read_text())
    assert ev["pack"] == pack_id and ev["kind"] == pack.adapter_kind
    assert [k for k in pack.metric_names if k not in ev] == []
    assert ev["roundtrip_cos"] >= 0.999 and ev["trained_steps"] == demo_cache.STEPS
    logged = [json.loads(line) for line in (project.checkpoints_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = logged[0], logged[-1]
    assert last["step"] == demo_cache.STEPS and last["cos"] > first["cos"] and last["rel_mse"] < first["rel_mse"]
    card_reads_back(project, pack_id)          # in the test that waits for the run, not in one more that waits too


def card_reads_back(project: Project, pack_id: str) -> None:
    """The model card the run's stages wrote beside the export (issue 54): huggingface_hub's ModelCard reads it, with
    the teacher and student repos, the tags and this export's eval.json figures; a demo says it is a machinery check
    first; the engine command names the GGUF by its name; the plot sits beside it; no folder of this machine."""
    from huggingface_hub import ModelCard
    text = project.card_path().read_text(encoding="utf-8")
    card = ModelCard.load(project.card_path())
    data = card.data.to_dict()
    materials = {m.id: m.repo for m in project.pack.project_materials(project)}
    assert data["base_model"][0] == materials.get("teacher", project.pack.teacher_repo)
    assert materials["student_tokenizer"] in data["base_model"]
    assert {"gguf", "pig_clip", pack_id, "machinery-check"} <= set(data["tags"])
    # model-index holds this export's figures: eval.json's numbers, each under its own key
    record = json.loads(project.eval_json.read_text())
    assert Path(record["gguf"]).name == project.gguf_path().name
    results = card.data.eval_results
    assert results and {r.metric_type for r in results} >= set(project.pack.judge.keys() if project.pack.judge else ())
    for r in results:
        assert r.metric_value == record[r.metric_type]
    # the body: a demo says so first; the engine command names the GGUF by its name; the plot sits beside it
    assert card.text.lstrip().startswith("**Machinery check")
    command = text.split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert project.gguf_path().name in command.split() and "/" not in command
    assert project.card_plot_path().read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"]({project.card_plot_path().name})" in text
    # nothing of this machine's folders
    for folder in (project.root, project.output_dir(), Path(os.environ.get("HOME", "/nonexistent"))):
        assert str(folder) not in text


@pytest.mark.parametrize("pack_id", IDS)
def test_inspect_accepts_the_adapter_and_every_file_beside_it(pack_id, trained):
    project, pack = trained(pack_id), PACKS[pack_id]
    r = cli_here("inspect", str(project.gguf_path()), "--json")        # the command's entry point, in this process
    info = json.loads(r.stdout)
    assert r.returncode == 0 and info["kind"] == "adapter" and info["variant"] == pack.adapter_kind
    assert info["problems"] == [] and info["kvs"]["adapter.pack"] == pack_id
    for extra in pack.extras.outputs(project):
        r = cli_here("inspect", str(extra), "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert not [p for p in json.loads(r.stdout)["problems"] if p["fatal"]]


@pytest.mark.parametrize("pack_id", IDS)
def test_infer_on_the_project_equals_the_numpy_engine(pack_id, trained, tmp_path):
    from trainer_core.contract.student import load_student
    project, pack = trained(pack_id), PACKS[pack_id]
    from trainer_core.cli import main as cli_main
    out = tmp_path / "rows.npy"                      # the command's own entry point, in this process
    assert cli_main(["infer", "--project", str(project.root), "--prompt", PROMPT, "--out", str(out)]) == 0
    student = load_student(require_material(project, "student"), require_material(project, "student_tokenizer"))
    rows = pack.student_states(student, PROMPT)
    given = pack.prompt_inputs(project, project.gguf_path(), PROMPT, None)
    want = engine_forward(gguf_tensors(project.gguf_path()), rows, given.get("--seed-ids"), given.get("--t5-ids"))
    np.testing.assert_allclose(np.load(out), want, atol=1e-4, rtol=1e-4)
    if pack.engine is not None:               # the ids the engine runs the student over are the rows it hands over
        assert len(engine_ids(pack, student, PROMPT)) == rows.shape[0]


def _models(project: Project) -> tuple:
    from trainer_core.contract.shards import mock_enabled
    from trainer_core.stages.precompute import load_models
    student, teacher, device = load_models(project, ListReport())
    session = project.pack.prepare(project, student, teacher, ListReport())
    return student, teacher, session, project.pack.budgets(project, device), mock_enabled(project)


def _per_sample(tensors: dict, extra: dict) -> dict[str, tuple]:
    """text → (its student rows, its target rows, its ids) of a shard, from the packed rows and their lengths."""
    q = torch.split(tensors["q_pack"], tensors["len"].tolist())
    t = torch.split(tensors["t_pack"], tensors["t_len"].tolist())
    ids = torch.split(tensors["ids"], tensors["len"].tolist())
    return {text: (q[i], t[i], ids[i]) for i, text in enumerate(extra["prompts"])}


def _distinct(samples: list, n: int) -> list:
    seen, out = set(), []
    for s in samples:
        text = s["text"] if isinstance(s, dict) else s
        if text not in seen:
            seen.add(text)
            out.append(s)
    return out[:n]


@pytest.mark.parametrize("pack_id", IDS)
def test_batched_precompute_equals_one_sample_at_a_time(pack_id, tmp_path):
    project = Project.open(demo_cache.copy_built(pack_id, tmp_path))
    from trainer_core.stages import corpus
    assert corpus.run(project, ListReport()) == "done"
    pack = project.pack
    samples = _distinct(pack.corpus_kind.read_samples(project, project.corpus_files()[1]), 5)
    student, teacher, session, budgets, _ = _models(project)
    together = _per_sample(*pack.make_shard(samples, student, teacher, budgets, session))
    assert len(together) == len(samples)
    for sample in samples:
        (text, (q, t, ids)), = _per_sample(*pack.make_shard([sample], student, teacher, budgets, session)).items()
        q_all, t_all, ids_all = together[text]
        assert ids_all.tolist() == ids.tolist(), text
        torch.testing.assert_close(q_all.float(), q.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(t_all.float(), t.float(), atol=2e-2 * float(t.float().abs().max()), rtol=2e-2)


@pytest.mark.parametrize("pack_id", REFERENCED)
def test_the_teacher_equals_the_packs_reference_forward(pack_id, tmp_path):
    project = Project.open(demo_cache.copy_built(pack_id, tmp_path))
    from trainer_core.stages import corpus
    assert corpus.run(project, ListReport()) == "done"
    pack = project.pack
    texts = [s for s in pack.corpus_kind.read_samples(project, project.corpus_files()[1])
             if not (isinstance(s, dict) and s["images"])]
    samples = _distinct(texts, 4)
    student, teacher, session, budgets, mock = _models(project)
    assert not mock, "the reference forward is checked against the pack's real teacher"
    stored = _per_sample(*pack.make_shard(samples, student, teacher, budgets, session))
    for sample, ref in zip(samples, pack.reference_forward(project, samples)):
        text = sample["text"] if isinstance(sample, dict) else sample
        rows = stored[text][1].float()
        assert rows.shape == ref.shape, (text, rows.shape, ref.shape)
        scale = float(ref.abs().max())
        torch.testing.assert_close(rows, ref.to(torch.bfloat16).float(), atol=2e-2 * scale, rtol=2e-2)


def test_every_pack_of_this_repository_declares_its_engine_facts():
    """bench/'s engine check reads them; a pack shipped on its own may leave them out."""
    assert OURS and [p for p in OURS if PACKS[p].engine is None] == []


def test_the_engine_facts_are_consistent():
    for pack in (PACKS[p] for p in IDS if PACKS[p].engine is not None):
        assert pack.engine.versions and set(pack.engine.bank_versions) <= set(pack.engine.versions), pack.id
        assert pack.engine.teacher in ("", "qwen3", "qwen3_vl") and pack.engine.references in ("", "mmproj",
                                                                                              "vision_gguf")


@pytest.mark.parametrize("pack_id", IDS)
def test_the_default_plan_is_within_its_bounds_of_the_demo_run(pack_id, tmp_path):
    ran = demo_cache.run_figures(pack_id)
    plan = make_plan(Project.open(demo_cache.copy_built(pack_id, tmp_path)))
    assert not plan["calibrated"]
    cpu = sum(p["cpu_seconds"] or 0.0 for p in ran["processes"])
    within_bounds(pack_id, "DEFAULT PLAN", plan, idle_seconds(ran), ran["written_bytes"], ran["peak_rss_bytes"],
                  wall_s=ran["seconds"], cpu_s=cpu)


@pytest.fixture(scope="module")
def this_machine() -> dict:
    return machine()


def test_the_first_recording_is_of_the_runs_the_suite_shares():
    first = json.loads(RECORDED.read_text())
    assert first["settings"] == list(demo_cache.SETTINGS) and set(first["packs"]) == set(OURS)


@pytest.mark.parametrize("pack_id", IDS)
def test_the_demo_exports_the_recorded_bytes(pack_id, tmp_path, this_machine):
    """Exports must not change across refactors: the shared demo run (tests/demo_cache.py, the stage processes)
    writes the bytes `gguf-trainer run` wrote when bench/demo_hashes.py recorded them on this kind of machine.
    Float results depend on the CPU and the torch build; where nothing is recorded for this machine or pack, the
    same checkpoint exported and evaluated again must write the same bytes."""
    root = demo_cache.copy_trained(pack_id, tmp_path)
    got = fingerprint(root)
    first = json.loads(RECORDED.read_text())["packs"]
    if pack_id in first:                                  # the files it writes are the same on every machine
        assert got["extras"].keys() == first[pack_id]["extras"].keys()
    record = recorded_for(this_machine)
    if record is not None and pack_id in record["packs"]:
        assert record["settings"] == list(demo_cache.SETTINGS)
        want = {k: record["packs"][pack_id][k] for k in ("gguf", "extras", "eval")}
        assert got == want, (f"{pack_id}: the export or eval.json changed from the run recorded on this kind of "
                             f"machine ({record.get('recorded', '')}); if only the machine differs (float probe "
                             f"{this_machine['float_probe'][:12]}), record it: bench/demo_hashes.py --write")
        return
    from trainer_core.stages import evaluate, export
    assert export.run(Project.open(root), ListReport(), lambda: False) == "done"
    assert evaluate.run(Project.open(root), ListReport(), lambda: False) == "done"
    assert fingerprint(root) == got
