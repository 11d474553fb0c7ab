"""Every demo export as the engine itself conditions with it, against `gguf-trainer infer --prompt`.

tests/data/engine_rows.json holds what ggk 0.9.7's own conditioners produced for the demo exports of
tests/demo_cache.py (the same bytes: the file records each adapter's sha256), per pack, model version
and prompt: the token ids the engine fed (the student's template ids, the T5 window, the bridge's seed
ids) and fingerprints of the student rows and the adapter rows; for the packs whose conditioner reads a
reference image, the same with a reference (and the tower's rows and slots); for the Qwen3 / Qwen3-VL
teachers, the rows the engine took from a tiny teacher run as --llm. `python bench/engine_check.py --all
--write-fixture` wrote it, from the engine sources compiled unchanged behind
bench/engine_driver/ggk_cond.cpp. Here the trainer's side (tests/trainer_side/, which that check runs too)
runs on the same exports: the pack's ids, the student rows, and the rows `gguf-trainer infer --prompt`
writes, within 1e-4 of max |ours|.

When the compiled driver is in the cache (bench/engine_check.py has run on this machine), one pack is
also conditioned live by the engine: the check's own command line, in a process of its own.
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import demo_cache
from conftest import REPO
from demo_fingerprint import machine, recorded_for
from trainer_core.cli import main as cli_main
from trainer_core.packs import PACKS as ALL
from trainer_core.packs.lookup import resolve_material
from trainer_side import references, teacher
from trainer_side.ours import FIXTURE as FIXTURE_PATH
from trainer_side.ours import TOLERANCE, Ours, fingerprint, fingerprint_rel

FIXTURE = json.loads(FIXTURE_PATH.read_text(encoding="utf-8"))
PACKS = sorted(FIXTURE["packs"])
CLI_PROMPTS = ("", "a (red:1.3) fox in a snowy forest", "一只猫坐在窗台上，夕阳")


def test_the_fixture_covers_every_pack_and_the_prompts_the_issue_names():
    assert set(PACKS) == set(ALL)
    assert FIXTURE["settings"] == demo_cache.SETTINGS[0]
    prompts = [e["prompt"] for e in FIXTURE["packs"][PACKS[0]]["versions"][ALL[PACKS[0]].engine.versions[0]]]
    assert "" in prompts and any(":1." in p for p in prompts) and any(not p.isascii() for p in prompts)
    assert any(len(p) > 600 for p in prompts)          # 120+ T5 pieces
    for pack_id in PACKS:
        assert set(FIXTURE["packs"][pack_id]["versions"]) == set(ALL[pack_id].engine.versions)


@pytest.fixture(scope="module")
def ours_of():
    made: dict = {}

    def get(pack_id: str) -> Ours:
        if pack_id not in made:
            made[pack_id] = Ours(demo_cache.trained(pack_id))
        return made[pack_id]
    return get


def _the_recorded_export(ours: Ours, pack_id: str) -> None:
    """Go on only where the demo export is the one the fixture conditions. Its adapters were exported on a machine
    that reproduces tests/data/demo_hashes.json; a machine that rounds the demo run differently (another float
    probe, tests/demo_fingerprint.py) trains other bytes, and the engine's rows of those adapters do not apply to
    its own: that is a skip with its reason, never a pass. Where this machine is known to reproduce the recorded
    export, a changed export fails."""
    sha = hashlib.sha256(ours.adapter_path.read_bytes()).hexdigest()
    if sha == FIXTURE["packs"][pack_id]["gguf_sha256"]:
        return
    this = machine()
    record = recorded_for(this)
    assert record is None or record["packs"].get(pack_id, {}).get("gguf") != FIXTURE["packs"][pack_id]["gguf_sha256"], (
        "the demo export changed since tests/data/engine_rows.json was written: run "
        "`python bench/engine_check.py --all --write-fixture` (it needs g++ and cmake)")
    pytest.skip(f"this machine (float probe {this['float_probe'][:12]}) exports another demo adapter than the one "
                "whose engine rows tests/data/engine_rows.json holds; `python bench/engine_check.py --all` runs the "
                "engine on this machine's own exports")


def _infer_argv(ours: Ours, text: str, version: str, out: Path, t5_file: Path) -> list[str]:
    argv = ["infer", "--adapter", str(ours.adapter_path), "--student", str(ours.student_gguf), "--tokenizer",
            str(resolve_material(ours.project, "student_tokenizer")), "--pack", ours.pack.id,
            "--prompt", text, "--out", str(out)]
    t5_ids = ours.pack.prompt_inputs(ours.project, ours.adapter_path, text, None).get("--t5-ids")
    if t5_ids is not None:                   # the window the engine takes from the project's T5 tokenizer
        t5_file.write_text("".join(f"{int(i)}\n" for i in t5_ids))
        argv += ["--t5-ids", str(t5_file)]
    return argv + (["--bank"] if (version in ours.pack.engine.bank_versions) else [])


@pytest.mark.parametrize("pack_id", PACKS)
def test_infer_prompt_gives_the_engines_ids_and_rows(pack_id, ours_of, tmp_path, capsys):
    ours = ours_of(pack_id)
    recorded = FIXTURE["packs"][pack_id]
    _the_recorded_export(ours, pack_id)
    for version, entries in recorded["versions"].items():
        for entry in entries:
            text = entry["prompt"]
            mine = ours.predict(text, version)
            assert mine["ids"] == entry["ids"] or entry["ids"] is None, (version, text)
            if "t5_ids" in entry:
                assert list(mine["t5_ids"]) == entry["t5_ids"], (version, text)
            if "seed_ids" in entry:
                assert list(mine["seed_ids"]) == entry["seed_ids"], (version, text)
            assert fingerprint_rel(mine["hidden"], entry["student"]) <= TOLERANCE
            assert fingerprint_rel(mine["rows"], entry["rows"]) <= TOLERANCE, (version, text)
            if text in CLI_PROMPTS:                     # and the command itself, on the hardest three
                out = tmp_path / "rows.npy"
                assert cli_main(_infer_argv(ours, text, version, out, tmp_path / "t5.txt")) == 0
                assert fingerprint_rel(np.load(out), entry["rows"]) <= TOLERANCE, (version,
                                                                                                            text)
    capsys.readouterr()


IMAGE_PACKS = sorted(p for p in PACKS if "images" in FIXTURE["packs"][p])
TEACHER_PACKS = sorted(p for p in PACKS if "teacher" in FIXTURE["packs"][p])


def test_the_fixture_has_a_reference_image_check_for_every_pack_whose_conditioner_reads_one():
    assert IMAGE_PACKS == sorted(p.id for p in ALL.values() if p.engine.references)
    assert TEACHER_PACKS == sorted(p.id for p in ALL.values() if p.engine.teacher)
    for pack_id in IMAGE_PACKS:
        assert set(FIXTURE["packs"][pack_id]["images"]) == set(ALL[pack_id].engine.versions)
        for version, entries in FIXTURE["packs"][pack_id]["images"].items():
            assert [e["prompt"] for e in entries] == list(references.PROMPTS), (pack_id, version)
            assert len({e["ref"] for e in entries}) >= 2, (pack_id, version)


@pytest.mark.parametrize("pack_id", IMAGE_PACKS)
def test_a_reference_image_gives_the_engines_ids_and_rows(pack_id, ours_of, tmp_path):
    """The trainer's side of the image check (trainer_side/references.py: the pack's preprocessing, template, slots
    and infer, on the check's 16-head tower) against the engine's recorded rows for the same references."""
    ours = ours_of(pack_id)
    _the_recorded_export(ours, pack_id)
    images = references.reference_images(ours.project.root, None)
    for version, entries in FIXTURE["packs"][pack_id]["images"].items():
        refs = references.references_for(ours, version, images, tmp_path / version)
        assert not isinstance(refs, str), refs
        by_name = {ref.name: ref for ref in refs.refs}
        for entry in entries:
            mine = refs.predict(entry["prompt"], by_name[entry["ref"]])
            assert references.jsonable(mine["ids"]) == entry["ids"], (version, entry["prompt"])
            assert entry["slots"] is None or mine["slots"] is None or mine["slots"] == entry["slots"]
            for ours_rows, key in ((mine["rows"], "rows"), (mine["hidden"], "student"), (mine["vis"], "vis")):
                assert fingerprint_rel(ours_rows, entry[key]) <= TOLERANCE, (
                    version, entry["prompt"], key)


@pytest.mark.parametrize("pack_id", TEACHER_PACKS)
def test_the_teacher_targets_are_the_engines_own_teacher_rows(pack_id, ours_of, tmp_path):
    """The pack's own teacher (trainer_side/teacher.py: a 36-layer tiny Qwen3 / Qwen3-VL, the pack's
    build_teacher) against the rows the engine took from the same weights as --llm, no adapter."""
    ours = ours_of(pack_id)
    own, _ = teacher.pack_teacher(ours, tmp_path, gguf=False)
    for version, entries in FIXTURE["packs"][pack_id]["teacher"].items():
        for entry in entries:
            mine, ids = teacher.predict_teacher(ours, own, entry["prompt"])
            assert ids == entry["ids"], (version, entry["prompt"])
            assert fingerprint_rel(mine, entry["teacher"]) <= TOLERANCE, (
                version, entry["prompt"])


def test_the_fingerprint_sees_one_wrong_element():
    rows = np.random.default_rng(1).standard_normal((40, 24)).astype(np.float32)
    recorded = fingerprint(rows)
    assert fingerprint_rel(rows, recorded) < 1e-6
    bent = rows.copy()
    bent[17, 5] += 1e-2 * np.abs(rows).max()        # seen at ~|basis[5]| × 1e-2, the basis' entries ~ 1/sqrt(24)
    assert fingerprint_rel(bent, recorded) > TOLERANCE
    assert fingerprint_rel(rows[:-1], recorded) == float("inf")


def test_the_engine_itself_when_its_build_is_cached(tmp_path):
    """bench/engine_check.py on a demo export (its text and teacher paths), when this machine has built the
    engine: run as a command, the way its users run it."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)        # the suite gives each worker its own HOME
    cache = Path(os.environ.get("XDG_CACHE_HOME", home / ".cache"))
    if not (cache / "gguf-trainer" / "ggk-0.9.7-cond" / "ggk_cond").exists():
        pytest.skip(f"no compiled engine driver under {cache}/gguf-trainer (bench/engine_check.py builds it)")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in ("", "a (red:1.3) fox", "一只猫坐在窗台上")), encoding="utf-8")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "engine_check.py"), "--pack", "qwen3_zimage", "--project",
                        str(demo_cache.trained("qwen3_zimage")), "--prompts", str(prompts), "--json"],
                       capture_output=True, text=True, timeout=1200,
                       env={**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["ids_equal"] and result["max_rel"] <= TOLERANCE, result
    assert result["teacher_prompts"] == len(teacher.PROMPTS) and result["teacher_max_rel"] <= TOLERANCE, result
