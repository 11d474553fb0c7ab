"""One pack's export through the engine's own conditioning code (text.py, then vision.py and teacher.py where
the pack declares references or a teacher the engine runs), and the command line's loop over the packs."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainer_side.ours import FIXTURE, PIXEL_TOLERANCE, TOLERANCE, Ours
from trainer_side.references import reference_images

from . import REPO
from .driver import VERSION, build_driver, engine_source
from .teacher import check_teacher
from .text import check_text
from .vision import check_images

__all__ = ["PROMPTS", "DEMO_STEPS", "demo_project", "check_pack", "run"]

PROMPTS = REPO / "tests" / "data" / "engine_check_prompts.jsonl"
DEMO_STEPS = "train.steps=60"                 # the demo runs tests/demo_cache.py shares (tests/data/demo_hashes.json)


def demo_project(pack_id: str, top: Path) -> Path:
    """The pack's demo, trained for a few steps and exported, in a fresh `gguf-trainer` process."""
    from trainer_core.packs import get_pack
    folder = top / get_pack(pack_id).default_folder
    env = {**os.environ, "GGUF_TRAINER_HOME": str(top / "home"), "PYTHONPATH": str(REPO)}
    for argv in (["demo", "--pack", pack_id, "--project", str(folder)],
                 ["set", "--project", str(folder), "--set", DEMO_STEPS],
                 ["run", "--project", str(folder)]):
        subprocess.run([sys.executable, "-m", "trainer_core", *argv], env=env, check=True, stdout=subprocess.DEVNULL)
    return folder


def check_pack(driver: Path, project_dir: Path, prompts: list[str], work: Path, fixture: dict | None = None,
               images: str | None = None, extras: dict | None = None) -> dict:
    """Run the engine on every prompt and version and compare; with `fixture` (a dict), also fill it with the
    engine's ids and row fingerprints of text.FIXTURE_PROMPTS. A pack that declares references also gets the
    reference prompts (`images`: a folder, else the demo's scenes), one whose teacher the engine runs the teacher
    prompts; with `extras` (a dict), their fixture entries go to extras["images"] and extras["teacher"], per
    version."""
    ours = Ours(project_dir)
    facts = ours.pack.engine
    text = check_text(driver, ours, prompts, work, fixture)
    worst, worst_student, ids_equal = text["max_rel"], text["student_max_rel"], text["ids_equal"]
    problems = list(text["problems"])
    seen: dict[str, Any] = {"images": 0}
    if facts.references:
        refs = reference_images(project_dir, images)
        if not refs:
            problems.append(f"no reference images for the image check in {images or 'the demo'}")
            ids_equal = False
        for version in facts.versions if refs else ():
            entries = extras.setdefault("images", {}).setdefault(version, []) if extras is not None else None
            seen = check_images(driver, ours, version, refs, work / "images" / version, entries)
            worst, worst_student = max(worst, seen["max_rel"]), max(worst_student, seen["student_max_rel"])
            ids_equal = ids_equal and seen["ids_equal"]
            problems += seen["problems"]
    taught: dict[str, Any] = {}
    for version in facts.versions if facts.teacher else ():
        entries = extras.setdefault("teacher", {}).setdefault(version, []) if extras is not None else None
        done = check_teacher(driver, ours, version, work / "teacher" / version, entries)
        taught = {"prompts": taught.get("prompts", 0) + done["prompts"],
                  "teacher_max_rel": max(taught.get("teacher_max_rel", 0.0), done["teacher_max_rel"])}
        ids_equal = ids_equal and done["ids_equal"]
        problems += done["problems"]
    for p in problems:
        print(p, file=sys.stderr)
    return {"pack": ours.pack.id, "prompts": len(prompts), "max_rel": worst, "ids_equal": ids_equal,
            "student_max_rel": worst_student, "images": seen["images"],
            **{k: seen[k] for k in ("vis_max_rel", "pixels_max_abs") if seen.get(k) is not None},
            **({"teacher_prompts": taught["prompts"], "teacher_max_rel": taught["teacher_max_rel"]} if taught else {}),
            "versions": list(facts.versions), "engine_aborts": text["aborts"],
            "ok": ids_equal and worst <= TOLERANCE and seen.get("vis_max_rel", 0.0) <= TOLERANCE
            and (seen.get("pixels_max_abs") or 0.0) <= PIXEL_TOLERANCE and taught.get("teacher_max_rel", 0.0) <= TOLERANCE}


def run(pack_ids: list[str], project: str | None, prompts_file: str, images: str | None, engine: str | None,
        keep: str | None, write_fixture: bool) -> list[dict]:
    """Check each pack (its demo unless `project`), printing one JSON line each; with `write_fixture`, store the
    engine's ids and row fingerprints of every pack in tests/data/engine_rows.json. The results."""
    from trainer_core.packs import PACKS
    from trainer_core.project import Project
    prompts = [json.loads(line) for line in Path(prompts_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    driver = build_driver(engine_source(engine))
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="engine-check-"))
    results = []
    fixture: dict = {"ggk": VERSION, "generator": "bench/engine_check.py --all --write-fixture", "settings": DEMO_STEPS,
                     "packs": {}}
    try:
        for pack_id in pack_ids:
            made = work / pack_id / PACKS[pack_id].default_folder
            folder = Path(project) if project else made if (made / "eval.json").exists() or \
                (keep and made.is_dir()) else demo_project(pack_id, work / pack_id)
            entries: dict = {}
            extras: dict = {}
            result = check_pack(driver, folder, prompts, work / pack_id / "dumps", entries, images, extras)
            results.append(result)
            gguf = Project.open(folder).gguf_path()
            fixture["packs"][pack_id] = {"gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
                                         "aborts": result["engine_aborts"], "versions": entries, **extras}
            print(json.dumps(result), flush=True)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if write_fixture:
        from trainer_core.base.atomic import atomic_write_text
        atomic_write_text(FIXTURE, json.dumps(fixture, ensure_ascii=False, separators=(",", ":")) + "\n")
        print(f"wrote {FIXTURE}", file=sys.stderr)
    return results
