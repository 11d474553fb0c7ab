"""`gguf-trainer download`'s arguments, and its student half: find pig_clip GGUFs on the Hub, fetch one as the
project's student (student_hub.py), in the foreground with a progress bar."""
from __future__ import annotations

import argparse
import sys

from trainer_core.base.errors import TrainerError, UsageError
from trainer_core.base.diskspace import ensure_writable, human
from trainer_core.project import Project
from trainer_core.term_progress import TerminalBars, progress_line

__all__ = ["DOWNLOAD_DESCRIPTION", "add_download_arguments", "wants_student", "cmd_student"]

DOWNLOAD_DESCRIPTION = """\
Without student options: link copies of the materials you already have, then download the missing ones.

The student (pig_clip, a 0.6B Qwen3 text model as a GGUF, the file ggk takes as --llm) is not a Hub snapshot
of a fixed repo: find it, then pick one of the listed files (or link a file you have with
`gguf-trainer set --project DIR --set materials.student.path=FILE`):
  gguf-trainer download --project DIR --find-student            list pig_clip GGUFs on the Hub, numbered
  gguf-trainer download --project DIR --pick 1                  download the first of that list
  gguf-trainer download --project DIR --repo R --file F         download file F of repo R
Train on the f16 file: the adapter learns the rows of the student it is trained on. Quantized files (q8_0,
q4_k_m, ...) are for running in ggk; the trainer dequantizes one on load, but the adapter then learns its
rounding errors."""


def add_download_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DOWNLOAD_DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--id", nargs="+", metavar="ID", help="only these materials (default: every wanted one)")
    parser.add_argument("--required-only", action="store_true", help="skip optional materials")
    student = parser.add_argument_group("the student GGUF from the Hugging Face Hub")
    student.add_argument("--find-student", action="store_true", help="list the pig_clip GGUFs on the Hub, numbered")
    student.add_argument("--pick", type=int, metavar="N", help="download the Nth file --find-student lists")
    student.add_argument("--repo", metavar="R", help="with --file: download that file of this model repo")
    student.add_argument("--file", metavar="F", help="with --repo: the pig_clip GGUF's path in the repo")


def wants_student(args: argparse.Namespace) -> bool:
    return bool(args.find_student or args.pick is not None or args.repo or args.file)


def _listing(candidates: list, project: Project) -> str:
    from trainer_core.student_hub import quant_note
    width_repo = max(len(c.repo) for c in candidates)
    width_path = max(len(c.path) for c in candidates)
    lines = [f"{i:>3}  {c.repo:<{width_repo}}  {c.path:<{width_path}}  {human(c.size):>9}  "
             f"{c.quant or '?'}: {quant_note(c.quant)}" for i, c in enumerate(candidates, 1)]
    return "\n".join([f"pig_clip GGUFs on the Hub ({len(candidates)}):", *lines,
                      f"Download one: gguf-trainer download --project {project.root} --pick N"])


def cmd_student(args: argparse.Namespace) -> int:
    from trainer_core.materials import DEMO_OFFLINE, is_demo, material_lock, token_for
    from trainer_core.student_hub import STUDENT_ID, check_student_name, fetch_student, find_students
    if args.id or args.required_only:
        raise UsageError("--id and --required-only choose among the other materials; run the student options "
                         "(--find-student, --pick, --repo/--file) on their own.")
    if args.pick is not None and (args.repo or args.file):
        raise UsageError("--pick takes a file from --find-student's list and --repo/--file name one; give one "
                         "of the two.")
    if bool(args.repo) != bool(args.file):
        raise UsageError(f"{'--repo' if args.repo else '--file'} needs {'--file' if args.repo else '--repo'} too: "
                         "the repo and the path of the GGUF in it (`--find-student` lists them).")
    project = Project.open(args.project)
    if is_demo(project):
        raise UsageError(DEMO_OFFLINE)
    token = token_for(project)
    repo, path = args.repo, args.file
    if not repo:
        candidates = find_students(token)
        if not candidates:
            print("No pig_clip GGUF found on the Hub (searched model repos for pig_clip and pig-clip); if you "
                  f"have the file, link it: gguf-trainer set --project {project.root} --set "
                  "materials.student.path=FILE", file=sys.stderr)
            return 1
        if args.pick is None:
            print(_listing(candidates, project))
            return 0
        if not 1 <= args.pick <= len(candidates):
            raise UsageError(f"--pick {args.pick}: the search found {len(candidates)} pig_clip GGUF"
                             f"{'s' if len(candidates) > 1 else ''}; pick 1 to {len(candidates)} "
                             "(`--find-student` lists them).")
        chosen = candidates[args.pick - 1]
        repo, path = chosen.repo, chosen.path
    check_student_name(path)
    ensure_writable(project.materials_dir)
    with material_lock(project, STUDENT_ID) as held:
        if not held:
            print(f"{STUDENT_ID}: a detached download is already fetching it")
            return 0
        bars = TerminalBars(sys.stderr)
        print(f"{STUDENT_ID}: downloading {path} from {repo}", flush=True)
        try:
            target = fetch_student(project, repo, path, progress_line(STUDENT_ID, bars), token)
        except KeyboardInterrupt:
            bars.close(STUDENT_ID)
            print(f"{STUDENT_ID}: interrupted; run the same command again to continue where it stopped",
                  file=sys.stderr)
            return 130
        except TrainerError:
            bars.close(STUDENT_ID)
            raise
        bars.close(STUDENT_ID)
    print(f"{STUDENT_ID}: ready ({target})")
    return 0
