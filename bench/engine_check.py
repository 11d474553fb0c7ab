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
whose conditioner runs the adapter (the pack's `engine.versions`), the engine conditions the prompt
with SD_DUMP_COND set, and the trainer computes the same thing through `gguf-trainer infer
--prompt`'s path (the pack's student_states and prompt_inputs, the kind's infer). Compared:
 - max_rel: max |engine − ours| / max |ours| over every adapter output row (adapter_out.bin);
 - student_max_rel: the same over the student's rows (qwen_hidden.bin);
 - ids_equal: the token ids the engine used (tokens.txt, t5_ids.txt, seed_ids.txt, or the ids its
   conditioner logs) equal ours.
For the packs whose conditioner reads reference images (`engine.references`: MageFlow, Qwen-Image 2.1, the
Qwen3.5 bridge on both its versions, Ming) the check also runs (bench/engine/vision.py) three prompts with one
reference each, the demo's own scenes or the files of --images DIR: the engine gets a 16-head vision tower the
check builds (the engine fixes 16 heads; the demos' towers have 2: a llama.cpp mmproj, or the pack's own vision
GGUF), the raw pixels as the pipeline hands them over, and the trainer its own preprocessing, template and
slots; compared besides the rows above: vis_max_rel (the tower's rows, vis_embeds.bin), the slots
(vis_pos.txt, or the slots the conditioner logs), and where the conditioner dumps them pixels_max_abs (the
pixels its tower reads, ref0_rgb.bin: Qwen-Image 2.1, whose references are rendered at their own area and one
carries an alpha channel). LLaDA's reference goes through SigVQ straight to the DiT, never through the
conditioner or the adapter (gk-diffuser.cpp:3799-3846, 6203-6225), so it has no image check here.
For the packs whose teacher the engine can run (`engine.teacher`, a Qwen3 or Qwen3-VL text stack: Z-Image,
MageFlow, Qwen-Image 2.1, FLUX.3 Klein, Krea 2; bench/engine/teacher.py) the engine also runs a tiny teacher
itself (--llm, no adapter: its llm_hidden.bin), at the real layer count its conditioner taps, against the
pack's own teacher on the same weights: teacher_max_rel. The trainer's side of all of it is
tests/trainer_side/ (bench/engine/__init__.py lists the modules).
The last stdout line is JSON: {"pack", "prompts", "max_rel", "ids_equal", "student_max_rel",
"images", "versions", "ok"} (with --all, one such line per pack, then a summary line). Exit 0
when every figure holds (max_rel ≤ 1e-4, ids equal), 1 when one does not; with no C++ compiler
or cmake it prints {"skipped": ...} and exits 0.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import check  # noqa: E402
from engine.driver import VERSION, missing_tools  # noqa: E402
from trainer_side.ours import FIXTURE  # noqa: E402


def main() -> int:
    from trainer_core.packs import PACKS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack", choices=sorted(PACKS), help="the pack to check")
    parser.add_argument("--all", action="store_true", help="every pack")
    parser.add_argument("--project", help="a project whose export to check (default: the pack's demo, made here)")
    parser.add_argument("--prompts", default=str(check.PROMPTS), help="JSON lines, one prompt string each")
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
    missing = missing_tools("cmake")
    if missing:
        print(json.dumps({"skipped": f"no {' or '.join(missing)} on this machine"}))
        return 0
    packs = sorted((p for p in PACKS if PACKS[p].engine), key=lambda p: PACKS[p].order) if args.all else [args.pack]
    results = check.run(packs, args.project, args.prompts, args.images, args.engine, args.keep, args.write_fixture)
    if args.all:
        print(json.dumps({"packs": len(results), "all_ok": all(r["ok"] for r in results),
                          "max_rel": max(r["max_rel"] for r in results)}))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
