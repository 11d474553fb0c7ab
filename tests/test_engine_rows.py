"""Every demo export as the engine itself conditions with it, against `gguf-trainer infer --prompt`.

tests/data/engine_rows.json holds what ggk 0.9.7's own conditioners produced for the demo exports of
tests/demo_cache.py (the same bytes: the file records each adapter's sha256), per pack, model version
and prompt: the token ids the engine fed (the student's template ids, the T5 window, the bridge's seed
ids) and fingerprints of the student rows and the adapter rows; for the packs whose conditioner reads a
reference image, the same with a reference (and the tower's rows and slots); for the Qwen3 / Qwen3-VL
teachers, the rows the engine took from a tiny teacher run as --llm. `python bench/engine_check.py --all
--write-fixture` wrote it, from the engine sources compiled unchanged behind
bench/engine_driver/ggk_cond.cpp. Here the trainer's side runs on the same exports: the pack's ids,
the student rows, and the rows `gguf-trainer infer --prompt` writes, within 1e-4 of max |ours|.

When the compiled driver is in the cache (bench/engine_check.py has run on this machine), one pack is
also conditioned live by the engine.
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import sys
from pathlib import Path

import numpy as np
import pytest

import demo_cache
from trainer_core.cli import main as cli_main

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import engine_check  # noqa: E402
import engine_teacher  # noqa: E402
import engine_vision  # noqa: E402
from trainer_core.packs.lookup import resolve_material  # noqa: E402

FIXTURE = json.loads(engine_check.FIXTURE.read_text(encoding="utf-8"))
PACKS = sorted(FIXTURE["packs"])
CLI_PROMPTS = ("", "a (red:1.3) fox in a snowy forest", "一只猫坐在窗台上，夕阳")


def test_the_fixture_covers_every_pack_and_the_prompts_the_issue_names():
    from trainer_core.packs import PACKS as ALL
    assert set(PACKS) == set(ALL)
    assert FIXTURE["settings"] == demo_cache.SETTINGS[0]
    prompts = [e["prompt"] for e in FIXTURE["packs"][PACKS[0]]["versions"][ALL[PACKS[0]].engine_versions[0]]]
    assert "" in prompts and any(":1." in p for p in prompts) and any(not p.isascii() for p in prompts)
    assert any(len(p) > 600 for p in prompts)          # 120+ T5 pieces
    for pack_id in PACKS:
        assert set(FIXTURE["packs"][pack_id]["versions"]) == set(ALL[pack_id].engine.versions)


@pytest.fixture(scope="module")
def ours_of():
    made: dict = {}

    def get(pack_id: str) -> engine_check.Ours:
        if pack_id not in made:
            made[pack_id] = engine_check.Ours(demo_cache.trained(pack_id))
        return made[pack_id]
    return get


def _infer_argv(ours: engine_check.Ours, text: str, version: str, out: Path, t5_file: Path) -> list[str]:
    argv = ["infer", "--adapter", str(ours.adapter_path), "--student", str(ours.student_gguf), "--tokenizer",
            str(resolve_material(ours.project, "student_tokenizer")), "--pack", ours.pack.id,
            "--prompt", text, "--out", str(out)]
    if ours.t5 is not None:
        ids, _ = ours.t5.window(text, int(ours.adapter.config.num_queries))
        t5_file.write_text("".join(f"{i}\n" for i in ids))
        argv += ["--t5-ids", str(t5_file)]
    return argv + (["--bank"] if (version in ours.pack.engine.bank_versions) else [])


@pytest.mark.parametrize("pack_id", PACKS)
def test_infer_prompt_gives_the_engines_ids_and_rows(pack_id, ours_of, tmp_path, capsys):
    ours = ours_of(pack_id)
    recorded = FIXTURE["packs"][pack_id]
    assert hashlib.sha256(ours.adapter_path.read_bytes()).hexdigest() == recorded["gguf_sha256"], (
        "the demo export changed since tests/data/engine_rows.json was written: run "
        "`python bench/engine_check.py --all --write-fixture` (it needs g++ and cmake)")
    for version, entries in recorded["versions"].items():
        for entry in entries:
            text = entry["prompt"]
            mine = ours.predict(text, version)
            assert mine["ids"] == entry["ids"] or entry["ids"] is None, (version, text)
            if "t5_ids" in entry:
                assert list(mine["t5_ids"]) == entry["t5_ids"], (version, text)
            if "seed_ids" in entry:
                assert list(mine["seed_ids"]) == entry["seed_ids"], (version, text)
            assert engine_check.fingerprint_rel(mine["hidden"], entry["student"]) <= engine_check.TOLERANCE
            assert engine_check.fingerprint_rel(mine["rows"], entry["rows"]) <= engine_check.TOLERANCE, (version, text)
            if text in CLI_PROMPTS:                     # and the command itself, on the hardest three
                out = tmp_path / "rows.npy"
                assert cli_main(_infer_argv(ours, text, version, out, tmp_path / "t5.txt")) == 0
                assert engine_check.fingerprint_rel(np.load(out), entry["rows"]) <= engine_check.TOLERANCE, (version,
                                                                                                            text)
    capsys.readouterr()


IMAGE_PACKS = sorted(p for p in PACKS if "images" in FIXTURE["packs"][p])
TEACHER_PACKS = sorted(p for p in PACKS if "teacher" in FIXTURE["packs"][p])


def test_the_fixture_has_a_reference_image_check_for_every_pack_whose_conditioner_reads_one():
    assert IMAGE_PACKS == sorted(engine_vision.PACKS)
    assert TEACHER_PACKS == sorted(engine_teacher.PACKS)
    for pack_id in IMAGE_PACKS:
        for version, entries in FIXTURE["packs"][pack_id]["images"].items():
            assert [e["prompt"] for e in entries] == list(engine_vision.PROMPTS), (pack_id, version)
            assert len({e["ref"] for e in entries}) >= 2, (pack_id, version)


@pytest.mark.parametrize("pack_id", IMAGE_PACKS)
def test_a_reference_image_gives_the_engines_ids_and_rows(pack_id, ours_of, tmp_path):
    """The trainer's side of the image check (bench/engine_vision.py: the pack's preprocessing, template, slots
    and infer, on the check's 16-head tower) against the engine's recorded rows for the same references."""
    ours = ours_of(pack_id)
    images = engine_check.reference_images(ours.project.root, None)
    for version, entries in FIXTURE["packs"][pack_id]["images"].items():
        setup = engine_vision.prepare(ours, version, images, tmp_path / version, engine=False)
        assert not isinstance(setup, str), setup
        refs = {ref.name: ref for ref in setup.refs}
        for entry in entries:
            mine = engine_vision.predict_one(ours, setup, entry["prompt"], refs[entry["ref"]])
            assert engine_vision.jsonable(mine["ids"]) == entry["ids"], (version, entry["prompt"])
            assert entry["slots"] is None or mine["slots"] is None or mine["slots"] == entry["slots"]
            for ours_rows, key in ((mine["rows"], "rows"), (mine["hidden"], "student"), (mine["vis"], "vis")):
                assert engine_check.fingerprint_rel(ours_rows, entry[key]) <= engine_check.TOLERANCE, (
                    version, entry["prompt"], key)


@pytest.mark.parametrize("pack_id", TEACHER_PACKS)
def test_the_teacher_targets_are_the_engines_own_teacher_rows(pack_id, ours_of, tmp_path):
    """The pack's own teacher (bench/engine_teacher.py: a 36-layer tiny Qwen3 / Qwen3-VL, the pack's
    build_teacher) against the rows the engine took from the same weights as --llm, no adapter."""
    ours = ours_of(pack_id)
    teacher, _ = engine_teacher.pack_teacher(ours, tmp_path, gguf=False)
    for version, entries in FIXTURE["packs"][pack_id]["teacher"].items():
        for entry in entries:
            mine, ids = engine_teacher.predict_teacher(ours, teacher, entry["prompt"])
            assert ids == entry["ids"], (version, entry["prompt"])
            assert engine_check.fingerprint_rel(mine, entry["teacher"]) <= engine_check.TOLERANCE, (
                version, entry["prompt"])


def test_the_fingerprint_sees_one_wrong_element():
    rows = np.random.default_rng(1).standard_normal((40, 24)).astype(np.float32)
    recorded = engine_check.fingerprint(rows)
    assert engine_check.fingerprint_rel(rows, recorded) < 1e-6
    bent = rows.copy()
    bent[17, 5] += 1e-2 * np.abs(rows).max()        # seen at ~|basis[5]| × 1e-2, the basis' entries ~ 1/sqrt(24)
    assert engine_check.fingerprint_rel(bent, recorded) > engine_check.TOLERANCE
    assert engine_check.fingerprint_rel(rows[:-1], recorded) == float("inf")


def test_the_engine_itself_when_its_build_is_cached(tmp_path):
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)        # the suite gives each worker its own HOME
    driver = home / ".cache" / "gguf-trainer" / f"ggk-{engine_check.VERSION}-cond" / "ggk_cond"
    if not driver.exists():
        pytest.skip(f"no compiled engine driver at {driver} (bench/engine_check.py builds it)")
    prompts = ["", "a (red:1.3) fox", "一只猫坐在窗台上"]
    result = engine_check.check_pack(driver, demo_cache.trained("qwen3_zimage"), prompts, tmp_path)
    assert result["ok"] and result["ids_equal"] and result["max_rel"] <= engine_check.TOLERANCE, result
