"""A pack's export run through the engine's own conditioning code, against the trainer's prediction.

    python bench/engine_check.py --pack ID [--project DIR] [--prompts FILE] [--images DIR] [--engine DIR] [--json]
    python bench/engine_check.py --all [--json]          # every pack, one line each

Downloads the ggk 0.9.7 sdist (`pip download`, once, into ~/.cache/gguf-trainer) unless --engine
points at an unpacked one, builds its CPU backend with the sdist's CMake and the driver
bench/engine_driver/ggk_cond.cpp against the engine's sources, unchanged
(bench/engine_driver/build_cond.sh; cached). Without --project it makes the pack's demo and runs it
for a few steps in a temporary folder (the demo's tiny models; the student has the real head_dim
128 the engine assumes). Then, for every prompt (default tests/data/engine_check_prompts.jsonl:
the empty prompt, attention weights, a 120+ T5-token prompt, non-ASCII ones) and every model version
whose conditioner runs the adapter (the pack's `engine_versions`), the engine conditions the prompt
with SD_DUMP_COND set, and the trainer computes the same thing through `gguf-trainer infer
--prompt`'s path (the pack's student_states and prompt_inputs, the kind's infer). Compared:
 - max_rel: max |engine − ours| / max |ours| over every adapter output row (adapter_out.bin);
 - student_max_rel: the same over the student's rows (qwen_hidden.bin);
 - ids_equal: the token ids the engine used (tokens.txt, t5_ids.txt, seed_ids.txt, or the ids the
   Ming conditioner logs) equal ours.
For the packs whose conditioner reads reference images the check also runs (bench/engine_vision.py: MageFlow,
Qwen-Image 2.1, the Qwen3.5 bridge on both its versions, Ming) three prompts with one reference each, the
demo's own scenes or the files of --images DIR: the engine gets a 16-head vision tower the check builds (the
engine fixes 16 heads; the demos' towers have 2: a llama.cpp mmproj, or Ming's own vision GGUF), the raw
pixels as the pipeline hands them over, and the trainer its own preprocessing, template and slots; compared
besides the rows above: vis_max_rel (the tower's rows, vis_embeds.bin), the slots (vis_pos.txt, Ming's logged
slot ids), and for Qwen-Image 2.1 pixels_max_abs (the pixels its tower reads, ref0_rgb.bin; one reference
carries an alpha channel). LLaDA's reference goes through SigVQ straight to the DiT, never through the
conditioner or the adapter (gk-diffuser.cpp:3799-3846, 6203-6225), so it has no image check here.
For the packs whose teacher is a Qwen3 or Qwen3-VL text stack (bench/engine_teacher.py: Z-Image, MageFlow,
Qwen-Image 2.1, FLUX.3 Klein, Krea 2) the engine also runs a tiny teacher itself (--llm, no adapter: its
llm_hidden.bin), at the real layer count its conditioner taps, against the pack's own teacher on the same
weights: teacher_max_rel.
The last stdout line is JSON: {"pack", "prompts", "max_rel", "ids_equal", "student_max_rel",
"images", "versions", "ok"} (with --all, one such line per pack, then a summary line). Exit 0
when every figure holds (max_rel ≤ 1e-4, ids equal), 1 when one does not; with no C++ compiler
or cmake it prints {"skipped": ...} and exits 0.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import engine_teacher  # noqa: E402
import engine_vision  # noqa: E402
from engine_tokenizer import VERSION, engine_source  # noqa: E402
from trainer_core.packs.lookup import engine_ids as pack_engine_ids, resolve_material  # noqa: E402

PROMPTS = REPO / "tests" / "data" / "engine_check_prompts.jsonl"
FIXTURE = REPO / "tests" / "data" / "engine_rows.json"
FIXTURE_PROMPTS = (0, 1, 2, 4, 5, 6, 7, 13)   # empty, plain, weighted, 120+ T5 tokens, German, Chinese, accents, emoji
TOLERANCE = 1e-4
PIXEL_TOLERANCE = 1e-6                        # the pixels a tower reads (Qwen-Image 2.1 dumps them): float rounding
DEMO_STEPS = "train.steps=60"                 # the demo runs tests/demo_cache.py shares (tests/data/demo_hashes.json)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gguf-trainer"


def build_driver(engine: Path) -> Path:
    """bench/engine_driver/build_cond.sh into the cache (objects kept between runs); the driver's path."""
    out = cache_dir() / f"ggk-{VERSION}-cond"
    env = {**os.environ, "ENGINE": str(engine), "OUT": str(out)}
    subprocess.run(["bash", str(REPO / "bench" / "engine_driver" / "build_cond.sh")], check=True, env=env,
                   stdout=sys.stderr)
    return out / "ggk_cond"


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


def rows(path: Path, width: int) -> np.ndarray:
    return np.fromfile(path, dtype="<f4").reshape(-1, width)


def int_lines(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def logged_ids(log: list[str], what: str) -> list[int] | None:
    """The ids a conditioner prints at debug level ("ming_image student tokens (N): [a, b, …]")."""
    for line in log:
        m = re.search(re.escape(what) + r" \((\d+)\): \[([^\]]*)\]", line)
        if m:
            return [int(x) for x in m.group(2).split(",") if x.strip()]
    return None


def fingerprint(rows: np.ndarray) -> dict:
    """What tests/data/engine_rows.json keeps of the engine's rows [n, width]: each row projected on two seeded unit
    vectors, and its max |value| (the full rows of ten packs would be megabytes)."""
    basis = np.random.default_rng(0).standard_normal((rows.shape[1], 2))
    basis /= np.linalg.norm(basis, axis=0, keepdims=True)
    return {"shape": list(rows.shape), "proj": (rows.astype(np.float64) @ basis).round(7).tolist(),
            "maxabs": np.abs(rows).max(axis=1).astype(np.float64).round(7).tolist()}


def fingerprint_rel(ours: np.ndarray, engine: dict) -> float:
    """The largest projection or max-abs gap between `ours` and a fingerprint, over max |ours|. A gap spread over a
    row shows at about its L2 size; a single wrong element e at about e / sqrt(width) (the basis is random)."""
    if list(ours.shape) != engine["shape"]:
        return float("inf")
    mine = fingerprint(ours)
    gap = max(np.abs(np.array(mine["proj"]) - np.array(engine["proj"])).max(),
              np.abs(np.array(mine["maxabs"]) - np.array(engine["maxabs"])).max())
    return float(gap / max(np.abs(ours).max(), 1e-30))


class Ours:
    """The trainer's side of one export: `gguf-trainer infer --prompt`'s path."""

    def __init__(self, project_dir: Path) -> None:
        from trainer_core.contract.gguf_io import read_adapter_gguf
        from trainer_core.contract.student import load_student
        from trainer_core.project import Project
        self.project = Project.open(project_dir)
        self.pack = self.project.pack
        student_gguf = resolve_material(self.project, "student")
        self.student = load_student(student_gguf, resolve_material(self.project, "student_tokenizer"))
        self.student_gguf = student_gguf
        self.adapter_path = self.project.gguf_path()
        self.adapter = read_adapter_gguf(self.adapter_path)
        self.t5 = None
        if "--t5-ids" in self.adapter.config.spec.infer_options:
            from trainer_core.contract.engine_t5 import EngineT5
            self.t5 = EngineT5.from_folder(resolve_material(self.project, "teacher"))

    def predict(self, text: str, version: str) -> dict:
        from trainer_core.infer import run_adapter
        hidden = self.pack.student_states(self.student, text)
        derived = self.pack.prompt_inputs(self.adapter_path, text, None)
        t5_ids = None
        if self.t5 is not None:
            t5_ids, _ = self.t5.window(text, int(self.adapter.config.num_queries))
        out = run_adapter(self.adapter, hidden, t5_ids, seed_ids=derived.get("--seed-ids"),
                          bank=(version in self.pack.engine.bank_versions), empty_prompt=text == "")
        return {"hidden": hidden, "rows": out, "ids": pack_engine_ids(self.pack, self.student, text),
                "t5_ids": t5_ids, "seed_ids": derived.get("--seed-ids")}


def run_engine(driver: Path, ours: Ours, version: str, prompts: list[str], work: Path, vision: Path | None = None,
               extra: list[dict] | None = None) -> list[dict]:
    """The driver on every prompt (`extra`: each prompt's further fields, such as its "images" and the request's
    "width" and "height"; `vision`: the tower file); its answers, each with its dump folder."""
    items = []
    for i, text in enumerate(prompts):
        dump = work / version / str(i)
        dump.mkdir(parents=True, exist_ok=True)
        items.append({"text": text, "dump": str(dump), **(extra[i] if extra else {})})
    env = dict(os.environ)
    if ours.t5 is not None:                # the demo's tiny T5 vocabulary, as a tokenizer pack (SD_TOKENIZER_PACK)
        import engine_t5_fixture
        pack_dir = work / "t5pack"
        engine_t5_fixture.engine_pack(resolve_material(ours.project, "teacher"), pack_dir)
        env["SD_TOKENIZER_PACK"] = str(pack_dir)
    command = [str(driver), "--version", version, "--llm", str(ours.student_gguf),
               *(["--adapter", str(ours.adapter_path)] if ours.adapter_path else []),
               "--threads", str(min(4, os.cpu_count() or 1)), *(["--vision", str(vision)] if vision else [])]
    answers: list[dict] = []
    while len(answers) < len(items):          # a prompt the engine aborts on: note it, go on with the next
        rest = items[len(answers):]
        done = subprocess.run(command, input="".join(json.dumps(it, ensure_ascii=False) + "\n" for it in rest),
                              capture_output=True, text=True, encoding="utf-8", env=env)
        got = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        answers += got
        if done.returncode != 0 and len(got) < len(rest):
            lines = [x for x in done.stderr.splitlines() if "GGML_ASSERT" in x or "GGML_ABORT" in x or "error" in x]
            if not lines:
                raise SystemExit(f"the engine driver failed on {version} (exit {done.returncode}):\n"
                                 f"{done.stderr[-3000:]}")
            answers.append({"engine_abort": lines[-1].split("/src/")[-1]})
    for item, answer in zip(items, answers):
        answer["dump"] = Path(item["dump"])
    return answers


def engine_ids(answer: dict) -> list[int] | None:
    """The ids the engine fed: the student's template ids, or (T5 / bridge kinds) the seed ids."""
    dump = answer["dump"]
    if (dump / "tokens.txt").exists():
        return int_lines(dump / "tokens.txt")
    return logged_ids(answer.get("log", []), "ming_image student tokens")


def reference_images(project_dir: Path, folder: str | None) -> list[Path]:
    """The references of the image check: the files in `folder`, else the demo's own scenes."""
    where = Path(folder) if folder else project_dir / "materials" / "demo_images"
    return sorted(p for p in where.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))


def check_pack(driver: Path, project_dir: Path, prompts: list[str], work: Path, fixture: dict | None = None,
               images: str | None = None, extras: dict | None = None) -> dict:
    """Run the engine on every prompt and version and compare; with `fixture` (a dict), also fill it with the
    engine's ids and row fingerprints of the FIXTURE_PROMPTS. A pack whose references the check runs
    (engine_vision.PACKS) also gets engine_vision.PROMPTS with reference images (`images`: a folder), a pack
    whose teacher the engine can run (engine_teacher.PACKS) engine_teacher.PROMPTS through it; with `extras`
    (a dict), their fixture entries go to extras["images"] and extras["teacher"], per version."""
    ours = Ours(project_dir)
    c = ours.adapter.config
    worst = worst_student = 0.0
    ids_equal = True
    problems, aborts = [], []
    for version in ours.pack.engine.versions:
        answers = run_engine(driver, ours, version, prompts, work)
        if len(answers) != len(prompts):
            raise SystemExit(f"the engine driver answered {len(answers)} of {len(prompts)} prompts on {version}")
        for text, answer in zip(prompts, answers):
            mine = ours.predict(text, version)
            dump = answer["dump"]
            if "engine_abort" in answer:         # the dumps were written before it; the DiT never gets the rows
                aborts.append({"version": version, "prompt": text, "abort": answer["engine_abort"]})
            got = rows(dump / "adapter_out.bin", mine["rows"].shape[1])
            student = rows(dump / "qwen_hidden.bin", c.in_dim)
            if got.shape != mine["rows"].shape or student.shape != mine["hidden"].shape:
                problems.append(f"{version} {text[:40]!r}: engine rows {got.shape} / student {student.shape}, "
                                f"ours {mine['rows'].shape} / {mine['hidden'].shape}")
                ids_equal = False
                continue
            rel = float(np.abs(got - mine["rows"]).max() / max(np.abs(mine["rows"]).max(), 1e-30))
            rel_s = float(np.abs(student - mine["hidden"]).max() / max(np.abs(mine["hidden"]).max(), 1e-30))
            worst, worst_student = max(worst, rel), max(worst_student, rel_s)
            checks = {"ids": (engine_ids(answer), mine["ids"])}
            if fixture is not None and prompts.index(text) in FIXTURE_PROMPTS:
                entry = {"prompt": text, "rows": fingerprint(got), "student": fingerprint(student),
                         "ids": engine_ids(answer)}
                for name in ("t5_ids", "seed_ids"):
                    if (dump / f"{name}.txt").exists():
                        entry[name] = int_lines(dump / f"{name}.txt")
                fixture.setdefault(version, []).append(entry)
            if (dump / "t5_ids.txt").exists():
                checks["t5_ids"] = (int_lines(dump / "t5_ids.txt"), list(mine["t5_ids"]))
            if (dump / "seed_ids.txt").exists() and mine["seed_ids"] is not None:
                checks["seed_ids"] = (int_lines(dump / "seed_ids.txt"), list(mine["seed_ids"]))
            for name, (engine, ours_ids) in checks.items():
                if engine is not None and engine != ours_ids:
                    ids_equal = False
                    problems.append(f"{version} {text[:40]!r}: {name} engine {engine[:24]} ours {ours_ids[:24]}")
            if rel > TOLERANCE:
                problems.append(f"{version} {text[:40]!r}: max_rel {rel:.3g} (student {rel_s:.3g})")
    seen = {"images": 0}
    if ours.pack.id in engine_vision.PACKS:
        refs = reference_images(project_dir, images)
        if not refs:
            problems.append(f"no reference images for the image check in {images or 'the demo'}")
            ids_equal = False
        for version in ours.pack.engine.versions if refs else ():
            entries = (extras.setdefault("images", {}).setdefault(version, []) if extras is not None else None)
            seen = engine_vision.check_images(driver, ours, version, refs, work / "images" / version, entries)
            worst, worst_student = max(worst, seen["max_rel"]), max(worst_student, seen["student_max_rel"])
            ids_equal = ids_equal and seen["ids_equal"]
            problems += seen["problems"]
    taught: dict = {}
    for version in engine_teacher.PACKS.get(ours.pack.id, ((),))[0]:   # the teacher the engine can run, its rows
        entries = extras.setdefault("teacher", {}).setdefault(version, []) if extras is not None else None
        done = engine_teacher.check_teacher(driver, ours, version, work / "teacher" / version, entries)
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
            "versions": list(ours.pack.engine.versions), "engine_aborts": aborts,
            "ok": ids_equal and worst <= TOLERANCE and seen.get("vis_max_rel", 0.0) <= TOLERANCE
            and (seen.get("pixels_max_abs") or 0.0) <= PIXEL_TOLERANCE and taught.get("teacher_max_rel", 0.0) <= TOLERANCE}


def main() -> int:
    from trainer_core.packs import PACKS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack", choices=sorted(PACKS), help="the pack to check")
    parser.add_argument("--all", action="store_true", help="every pack")
    parser.add_argument("--project", help="a project whose export to check (default: the pack's demo, made here)")
    parser.add_argument("--prompts", default=str(PROMPTS), help="JSON lines, one prompt string each")
    parser.add_argument("--images", help="a folder of reference images for the packs whose image path the check "
                        "runs (default: the demo's own scenes)")
    parser.add_argument("--engine", help=f"an unpacked ggk-{VERSION} sdist (default: download it from PyPI)")
    parser.add_argument("--keep", help="make the demo projects under this folder and keep them (default: a "
                        "temporary folder, removed after)")
    parser.add_argument("--write-fixture", action="store_true",
                        help=f"with --all on the demos: store the engine's ids and row fingerprints in {FIXTURE}")
    parser.add_argument("--json", action="store_true", help="print only the JSON lines on stdout")
    args = parser.parse_args()
    if not (args.pack or args.all) or (args.all and args.project):
        parser.error("give --pack ID (optionally with --project) or --all")
    if args.write_fixture and (args.project or not args.all):
        parser.error("--write-fixture records the demos of every pack: use it with --all and no --project")
    missing = [tool for tool in (os.environ.get("CXX", "g++"), "cmake") if shutil.which(tool) is None]
    if missing:
        print(json.dumps({"skipped": f"no {' or '.join(missing)} on this machine"}))
        return 0
    prompts = [json.loads(line) for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
    driver = build_driver(engine_source(args.engine))
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="engine-check-"))
    results = []
    fixture: dict = {"ggk": VERSION, "generator": "bench/engine_check.py --all --write-fixture", "settings": DEMO_STEPS,
                     "packs": {}}
    try:
        for pack_id in (sorted(PACKS, key=lambda p: PACKS[p].order) if args.all else [args.pack]):
            made = work / pack_id / PACKS[pack_id].default_folder
            project = Path(args.project) if args.project else made if (made / "eval.json").exists() or \
                (args.keep and made.is_dir()) else demo_project(pack_id, work / pack_id)
            entries: dict = {}
            extras: dict = {}
            result = check_pack(driver, project, prompts, work / pack_id / "dumps", entries, args.images, extras)
            results.append(result)
            from trainer_core.project import Project
            gguf = Project.open(project).gguf_path()
            fixture["packs"][pack_id] = {"gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
                                         "aborts": result["engine_aborts"], "versions": entries, **extras}
            print(json.dumps(result), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.write_fixture:
        from trainer_core.base.atomic import atomic_write_text
        atomic_write_text(FIXTURE, json.dumps(fixture, ensure_ascii=False, separators=(",", ":")) + "\n")
        print(f"wrote {FIXTURE}", file=sys.stderr)
    if args.all:
        print(json.dumps({"packs": len(results), "all_ok": all(r["ok"] for r in results),
                          "max_rel": max(r["max_rel"] for r in results)}))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
