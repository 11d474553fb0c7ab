"""The student from the Hub: find pig_clip GGUF files in public model repos, fetch the chosen one the way every
material downloads (materials.download: a resumable partial file, size and sha256 checked, progress events),
check that it is a pig_clip student, and make it the project's student (`materials.student.path`).

The search asks `HfApi.list_models(search=...)` for each spelling of the name with the repos' file names
(`expand=["siblings"]`), then lists each repo holding a pig_clip GGUF with its files' sizes and hashes
(hub.list_files). Before that, one request without retries (hub.hub_unreachable) decides whether the Hub answers:
offline, the search ends at once with one sentence.

Jobs: `python -m trainer_core.student_hub --project DIR --repo R --file F` is the GUI's detached download. It
holds the student's material lock and writes the student's job files (materials.job_files), so the materials
table shows it as downloading with its progress, and a second request finds the lock held.
"""
from __future__ import annotations

import argparse
import glob
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainer_core.base.errors import first_line, TrainerError, UsageError
from trainer_core.base.events import Reporter
from trainer_core.hub import HubFile, endpoint, hub_unreachable, list_files
from trainer_core.jobs import JobReport, launch, run_job as run_detached
from trainer_core.materials import (DEMO_OFFLINE, DownloadError, as_say, download, is_demo, job_files,
                                    job_running, material_lock, token_for)
from trainer_core.packs.declarations import Material
from trainer_core.project import Project

__all__ = ["STUDENT_ID", "SEARCHES", "STUDENT_ABOUT", "Candidate", "quant_of", "quant_note", "find_students",
           "fetch_student", "start_student_job", "link_student", "check_student_name", "check_student_file"]

STUDENT_ID = "student"                    # the material every pack declares (packs/declarations.py)
SEARCHES = ("pig_clip", "pig-clip")       # the Hub's search matches a substring of the repo id: both spellings
SEARCH_LIMIT = 50                         # repos per search
_NAME = re.compile(r"pig[_-]?clip", re.IGNORECASE)
_NOT_STUDENT = ("adapter", "mmproj", "vision", "vae")      # pig_clip's companions in the same repos
_QUANT = re.compile(r"(?:^|[-_.])(f32|f16|bf16|q\d+_[a-z0-9_]+|q\d+|iq\d+_[a-z0-9_]+)$", re.IGNORECASE)
FULL_PRECISION = ("f16", "bf16", "f32")

STUDENT_ABOUT = (
    "The student is pig_clip, a 0.6B Qwen3 text model shipped as a GGUF: the file ggk takes as `--llm`, in "
    "place of the diffusion model's own text encoder. Train on pig_clip-f16.gguf: the adapter learns to map "
    "the rows of the student it is trained on, and f16 is the reference those rows should come from. "
    "Quantized files (q8_0, q4_k_m, …) are for running in ggk, where the trained adapter works with any of "
    "them (q8_0 or better for editing). The trainer accepts a quantized student too (it dequantizes it on "
    "load), but the adapter then learns that file's rounding errors; pick f16.")


@dataclass(frozen=True)
class Candidate:
    """A pig_clip GGUF in a Hub repo."""

    repo: str
    file: HubFile

    @property
    def path(self) -> str:
        return self.file.path

    @property
    def size(self) -> int:
        return self.file.size

    @property
    def quant(self) -> str:
        return quant_of(self.file.path)


def quant_of(name: str) -> str:
    """The quantization a GGUF's file name states (`pig_clip-q8_0.gguf` → "q8_0"), "" when it states none."""
    stem = Path(name).name
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    match = _QUANT.search(stem)
    return match.group(1).lower() if match else ""


def quant_note(quant: str) -> str:
    """What a student file of that quantization is for, in a few words."""
    if quant == "f16":
        return "train on this one"
    if quant in FULL_PRECISION:
        return "full precision (f16 is the one to train on)"
    if quant:
        return "quantized, for running in ggk; train on f16"
    return "quantization not in the name"


def _order(c: Candidate) -> tuple:
    rank = 0 if c.quant == "f16" else 1 if c.quant in FULL_PRECISION else 2
    return rank, c.repo.lower(), c.path.lower()


def _is_student_name(path: str) -> bool:
    name = Path(path).name.lower()
    return name.endswith(".gguf") and bool(_NAME.search(name)) and not any(w in name for w in _NOT_STUDENT)


def _unreachable_sentence(problem: str) -> str:
    return (f"The Hugging Face Hub ({endpoint()}) cannot be reached ({problem}), so no pig_clip GGUF can be "
            "searched for or downloaded now; connect and try again, or link a pig_clip-f16.gguf you have.")


def _hub_material(repo: str, path: str) -> Material:
    """The chosen file as a one-file snapshot, which materials.download fetches."""
    return Material(STUDENT_ID, "pig_clip student GGUF", "hf_snapshot", repo=repo, patterns=(glob.escape(path),))


def find_students(token: str | None = None) -> list[Candidate]:
    """Every pig_clip GGUF in the public model repos the Hub's search finds, f16 first; TrainerError (one
    sentence) when the Hub cannot be reached or refuses the search."""
    from huggingface_hub import HfApi
    problem = hub_unreachable()
    if problem:
        raise TrainerError(_unreachable_sentence(problem))
    api = HfApi(endpoint=endpoint(), token=token)
    repos: dict[str, None] = {}
    try:
        for term in SEARCHES:
            for info in api.list_models(search=term, limit=SEARCH_LIMIT, expand=["siblings"]):
                if any(_is_student_name(s.rfilename) for s in info.siblings or ()):
                    repos.setdefault(info.id)
    except Exception as e:      # noqa: BLE001 — refused, rate-limited, a connection lost since: one sentence
        raise TrainerError(f"The Hugging Face Hub ({endpoint()}) did not answer the search for pig_clip "
                           f"({first_line(e)}); try again later.") from None
    from huggingface_hub.utils import httpx
    found = []
    for repo in repos:
        try:
            files = list_files(Material(STUDENT_ID, "", "hf_snapshot", repo=repo, patterns=("*.gguf",)), token)
        except httpx.TransportError as e:     # the connection went away: no list that looks complete
            raise TrainerError(_unreachable_sentence(first_line(e))) from None
        except Exception:       # noqa: BLE001 — gated or gone since the search: not a candidate
            continue
        found += [Candidate(repo, f) for f in files if _is_student_name(f.path)]
    return sorted(found, key=_order)


def check_student_name(path: str) -> None:
    """UsageError unless `path` names a pig_clip GGUF (not an adapter or another companion beside it)."""
    if not _is_student_name(path):
        raise UsageError(f"{path} is not a pig_clip GGUF file name (pig_clip*.gguf); pick one that "
                         "`--find-student` lists.")


def check_student_file(path: Path) -> str | None:
    """Why `path` cannot be the student (one clause), None when `gguf-trainer inspect` takes it for a pig_clip
    student without a fatal problem."""
    from trainer_core.inspect_file import describe_gguf
    try:
        info = describe_gguf(path)
    except Exception as e:      # noqa: BLE001 — not a GGUF, truncated, unreadable
        text = first_line(e)
        if not text.startswith(str(path)):
            return f"it cannot be read as a GGUF ({text})"
        return "it" + text[len(str(path)):].split("; ")[0].rstrip(".")     # the reader's clause, without its advice
    if info.get("kind") != "student":
        return "it holds no pig_clip student (no model.layers.0.self_attn.q_proj.weight)"
    fatal = [p["message"] for p in info.get("problems", []) if p.get("fatal")]
    return fatal[0] if fatal else None


def _refuse_if_work_at_risk(project: Project, target: Path) -> None:
    """UsageError when another student would make the project's shards and checkpoints stale (as `set` refuses
    without --force)."""
    from trainer_core.packs.lookup import resolve_material
    _, work = project.work_at_risk([])
    current = resolve_material(project, STUDENT_ID)
    if work and (current is None or current.resolve() != target.resolve()):
        raise UsageError(f"Changing the student would make this project's work stale ({'; '.join(work)}); create a "
                         f"new project for it, or move that work aside: gguf-trainer set --project {project.root} "
                         f"--force --set materials.{STUDENT_ID}.path={target}")


def _use(project: Project, target: Path) -> None:
    """Make `target` the student: a path inside the project is kept relative, so the project can move."""
    try:
        shown = target.relative_to(project.root)
    except ValueError:
        shown = target
    project.update_settings([f"materials.{STUDENT_ID}.path={shown}"])


def link_student(project: Project, path: str | Path) -> Path:
    """Make a pig_clip GGUF on disk the project's student, after checking that it is one (UsageError: one
    sentence naming the file)."""
    target = project.resolve_user_path(str(path))
    if not target.is_file():
        raise UsageError(f"The student file {target} does not exist; give the full path of a pig_clip GGUF.")
    if target.suffix.lower() != ".gguf":
        raise UsageError(f"The student file {target} is not a .gguf file; give the pig_clip GGUF (pig_clip-f16.gguf).")
    problem = check_student_file(target)
    if problem:
        raise UsageError(f"{target} cannot be the student: {problem}; pick the pig_clip GGUF (pig_clip-f16.gguf).")
    _refuse_if_work_at_risk(project, target)
    _use(project, target)
    return target


def fetch_student(project: Project, repo: str, path: str, say: Callable[[dict[str, Any]], None] = lambda e: None,
                  token: str | None = None) -> Path:
    """Download `path` of `repo` into the project's materials/ (resuming a partial file), check that it is a
    pig_clip student and make it the project's student; returns where it lies. The caller holds the lock."""
    if is_demo(project):
        raise UsageError(DEMO_OFFLINE)
    check_student_name(path)
    dest = project.materials_dir
    _refuse_if_work_at_risk(project, dest / path)
    problem = hub_unreachable()
    if problem:
        raise TrainerError(_unreachable_sentence(problem))
    material = _hub_material(repo, path)
    token = token if token is not None else token_for(project)
    try:
        files = list_files(material, token)
    except Exception as e:      # noqa: BLE001 — no such repo, gated, refused
        raise DownloadError(f"{repo} cannot be listed on the Hub ({first_line(e)}); check the repo name "
                            "(`--find-student` lists them).") from None
    if [f.path for f in files] != [path]:
        raise DownloadError(f"{repo} has no file {path}; `--find-student` lists the pig_clip GGUFs there.")
    download(project, material, say, dest=dest, listing=files)
    target = dest / path
    problem = check_student_file(target)
    if problem:
        target.unlink(missing_ok=True)
        raise DownloadError(f"{repo}/{path} is not a usable pig_clip student: {problem}; the file was removed, "
                            "pick another one.")
    _use(project, target)
    say({"type": "log", "level": "info", "message": f"the student is now {target}"})
    return target


def start_student_job(project: Project, repo: str, path: str) -> int | None:
    """Launch the detached download of the chosen student file; None when one already runs."""
    if is_demo(project):
        raise UsageError(DEMO_OFFLINE)
    if job_running(project, STUDENT_ID):
        return None
    token = token_for(project)
    env = {"HF_TOKEN": token} if token else None    # in the environment, never on the command line
    argv = [sys.executable, "-m", "trainer_core.student_hub", "--project", str(project.root), "--repo", repo,
            "--file", path]
    return launch(job_files(project, STUDENT_ID), argv, cwd=project.root, env=env)


def run_job(project: Project, repo: str, path: str) -> int:
    with material_lock(project, STUDENT_ID) as held:
        if not held:
            Reporter()("log", level="info", message="another job is downloading the student")
            return 0
        report = JobReport(job_files(project, STUDENT_ID))
        return run_detached(report, lambda: {"path": str(fetch_student(project, repo, path, as_say(report)))},
                            expected=(Exception,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_core.student_hub")
    parser.add_argument("--project", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--file", required=True)
    args = parser.parse_args(argv)
    try:
        return run_job(Project.open(args.project), args.repo, args.file)
    except TrainerError as e:
        Reporter()("error", message=str(e))
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
