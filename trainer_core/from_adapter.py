"""`gguf-trainer new --from-adapter FILE_OR_HUB_REPO`: a project whose training starts from an adapter GGUF.

The source is a file here, or a Hub repo `OWNER/NAME[:path/in/repo.gguf]` (the path may be left out when
the repo holds one .gguf), fetched the way materials are (resumable Range requests, checked against the
Hub's size and sha256) with the project's token. The file is checked as `inspect` checks it (a layout the
engine would refuse or misread is refused with its problem) and against the adapter the project's pack
builds: the kind, in_dim (the student), out_dim and the kind's own fields (the teacher's shapes: queries,
seed table, taps, slots …) must be the project's; the width and the depth, which are training settings,
are taken from the file (train.width, train.depth). A mismatch is one sentence naming the field, exit 2,
and no project folder is left.

The project keeps a copy as start/adapter.gguf and the record start/from.json (contract/checkpoints.py); the
train stage starts from it whenever no checkpoint is left to resume (contract/adapter_import.py: the
inverse of the export), at step 0 with a fresh optimizer and the run's own lr schedule and data order.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from trainer_core.base.atomic import atomic_path, atomic_write_json
from trainer_core.base.errors import ModelFileError, UsageError
from trainer_core.project import Project, default_settings_dict, settings_from_dict

__all__ = ["HUB_SOURCE", "new_from_adapter", "start_from", "describe_start", "ADOPTED"]

HUB_SOURCE = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<path>.+\.gguf))?$")
ADOPTED = ("width", "depth")          # config fields that are training settings (train.<field>): taken from the file
_OPTION = "--from-adapter"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_source(text: str, token: str | None, into: Path,
                 say: Callable[[dict[str, Any]], None] = lambda e: None) -> tuple[Path, dict[str, Any]]:
    """(the local file, its record's source fields) for a file path or a Hub repo[:path]."""
    local = Path(os.path.expanduser(text))
    if local.is_file():
        return local, {"source": str(local.resolve())}
    match = HUB_SOURCE.match(text)
    if local.exists() or match is None:
        what = "a folder" if local.is_dir() else "not a file"
        raise UsageError(f"{_OPTION}: {text} is {what}; give an adapter .gguf file or a Hub repo as "
                         f"OWNER/NAME[:file.gguf].")
    return _fetch_hub(match.group("repo"), match.group("path"), token, into, say)


def _fetch_hub(repo: str, path: str | None, token: str | None, into: Path,
               say: Callable[[dict[str, Any]], None]) -> tuple[Path, dict[str, Any]]:
    from trainer_core import materials
    from trainer_core.hub import endpoint, hub_unreachable, list_files
    from trainer_core.packs.declarations import Material
    problem = hub_unreachable()
    if problem is not None:
        raise UsageError(f"{_OPTION}: {repo} is not a file here, and the Hugging Face Hub ({endpoint()}) cannot be "
                         f"reached ({problem}); download the .gguf and give its path.")
    material = Material(id="start_adapter", title=f"the adapter in {repo}", kind="hf_snapshot", repo=repo,
                        patterns=("*.gguf",))
    try:
        files = list_files(material, token)
    except Exception as e:       # noqa: BLE001 — no such repo, private, gated, refused: one sentence
        status = getattr(getattr(e, "response", None), "status_code", None)
        why = (f"the Hub has no repo {repo} you can read (HTTP {status}; a private repo needs a token with "
               f"access)" if status in (401, 403, 404) else f"the Hub refused listing {repo} ({type(e).__name__})")
        raise UsageError(f"{_OPTION}: {why}.") from None
    if path is not None:
        picked = [f for f in files if f.path == path]
        if not picked:
            listed = ", ".join(f.path for f in files) or "none"
            raise UsageError(f"{_OPTION}: {repo} has no file {path}; its .gguf files: {listed}.")
    elif len(files) != 1:
        if not files:
            raise UsageError(f"{_OPTION}: {repo} holds no .gguf file.")
        raise UsageError(f"{_OPTION}: {repo} holds {len(files)} .gguf files ({', '.join(f.path for f in files)}); "
                         f"name one as {repo}:FILE.gguf.")
    else:
        picked = files
    f = picked[0]
    dest = materials.fetch_verified(material, f, into, token, say)
    return dest, {"source": f"{repo}:{f.path}", "hub": {"repo": repo, "path": f.path, "endpoint": endpoint()}}


def _checked(project: Project, path: Path, source: str) -> tuple[Any, list[str], list[str]]:
    """(the file's config, the settings to take from it, the layout notes): refuses a file the engine would
    refuse or misread (inspect's fatal problems) and one whose adapter is not the project's."""
    from trainer_core.contract.adapter_import import mismatch_sentence, read_start
    from trainer_core.plan.estimate import adapter_config
    try:
        found, _, notes = read_start(path)
    except ModelFileError as e:
        raise ModelFileError(f"{_OPTION}: {e}") from None
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{_OPTION}: {source} is not a GGUF file ({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0][:160]}).") from None
    expected = adapter_config(project)
    if expected is None:
        raise UsageError(f"{_OPTION}: the {project.pack.title} pack cannot size its adapter before its materials "
                         f"are on disk; download them first (`gguf-trainer download`).")
    t = project.settings.train
    adopt = [f"train.{k}={getattr(found, k)}" for k in ADOPTED
             if getattr(found, k) != getattr(t, k) and found.kind == expected.kind]
    if adopt:
        from dataclasses import replace
        train = replace(t, **{k: getattr(found, k) for k in ADOPTED})
        expected = adapter_config(Project(project.root, replace(project.settings, train=train))) or expected
    why = mismatch_sentence(source, found, expected)
    if why is not None:
        raise UsageError(f"{_OPTION}: {why}")
    return found, adopt, notes


def _install(project: Project, path: Path, found: Any, record: dict[str, Any], notes: list[str]) -> None:
    from trainer_core.contract import checkpoints
    from trainer_core.contract.gguf_io import KV_PACK, KV_TRAINED_STEPS, KV_TRAINER, read_gguf_kvs
    target = checkpoints.start_path(project)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target, needs=path.stat().st_size) as tmp:
        shutil.copyfile(path, tmp)
    kvs = read_gguf_kvs(target)
    atomic_write_json(checkpoints.start_record_path(project), {
        **record, "sha256": _sha256(target), "size": target.stat().st_size, "kind": found.kind,
        "config": found.to_dict(), "trainer": kvs.get(KV_TRAINER), "pack": kvs.get(KV_PACK),
        "trained_steps": kvs.get(KV_TRAINED_STEPS), "notes": notes, "time": time.time()})


def new_from_adapter(root: str | os.PathLike, pack_id: str, name: str | None, source: str,
                     say: Callable[[dict[str, Any]], None] = lambda e: None) -> tuple[Project, list[str]]:
    """Create the project at `root` starting from `source`; everything is checked before the folder is made,
    and a failure after that removes what was made. Returns (project, the settings taken from the file)."""
    from trainer_core.base import token_store
    from trainer_core.project import folder_is_project
    root = Path(root).expanduser().resolve()
    raw = default_settings_dict(pack_id)
    if name is not None:
        raw["name"] = name
    if folder_is_project(root):
        return Project.create(root, pack_id, name), []      # refuses with its own sentence
    draft = Project(root, settings_from_dict(raw))
    with tempfile.TemporaryDirectory(prefix="gguf-trainer-from-") as scratch:
        path, record = fetch_source(source, token_store.resolve(""), Path(scratch), say)
        found, adopt, notes = _checked(draft, path, record["source"])
        existed = root.exists()
        before = set(os.listdir(root)) if existed else set()
        project = Project.create(root, pack_id, name)
        try:
            if adopt:
                project.update_settings(adopt)
            _install(project, path, found, {**record, "adopted": adopt}, notes)
        except BaseException:
            if not existed:
                shutil.rmtree(root, ignore_errors=True)
            else:
                for entry in set(os.listdir(root)) - before:
                    target = root / entry
                    shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
            raise
    return project, adopt


def start_from(project: Project, source: str, say: Callable[[dict[str, Any]], None] = lambda e: None) -> list[str]:
    """Make an existing project without checkpoints start from `source` (what `new --from-adapter` does after
    creating the folder); returns the settings taken from the file."""
    from trainer_core.contract import checkpoints
    from trainer_core.materials import token_for
    if any(checkpoints.exists(project, w) for w in (checkpoints.LAST, checkpoints.BEST)):
        raise UsageError(f"{_OPTION}: {project.root} has checkpoints, which training resumes from; reset training "
                         f"first (`gguf-trainer reset --project {project.root} train`).")
    with tempfile.TemporaryDirectory(prefix="gguf-trainer-from-") as scratch:
        path, record = fetch_source(source, token_for(project), Path(scratch), say)
        found, adopt, notes = _checked(project, path, record["source"])
        if adopt:
            project.update_settings(adopt)
        _install(project, path, found, {**record, "adopted": adopt}, notes)
    return adopt


def describe_start(project: Project) -> str | None:
    """One line for status and the Setup tab: where training starts from, None for a fresh start."""
    from trainer_core.contract import checkpoints
    record = checkpoints.read_start_record(project)
    if record is None:
        return None
    steps = record.get("trained_steps")
    by = record.get("trainer") or "another trainer"
    trained = f", {steps} steps by {by}" if isinstance(steps, int) else f", written by {by}"
    return f"{record.get('source')} ({record.get('kind', 'adapter')}{trained})"


def cmd_new(args: Any) -> int:
    """`new` (with or without --from-adapter)."""
    from trainer_core.readiness import launch_problems
    if args.from_adapter:
        project, adopt = new_from_adapter(args.project, args.pack, args.name, args.from_adapter)
    else:
        project, adopt = Project.create(args.project, args.pack, args.name), []
    print(f"created {project.pack.id} project {project.root} (adapter {project.settings.name}, "
          f"export {project.gguf_path()})")
    start = describe_start(project)
    if start:
        from trainer_core.contract.checkpoints import read_start_record
        print(f"  training starts from {start}" + (f"; taken from it: {', '.join(adopt)}" if adopt else ""))
        notes = (read_start_record(project) or {}).get("notes") or []
        if notes:           # departures from what we write that the engine reads all the same (F32 weights)
            print(f"  inspect notes {len(notes)} harmless departure(s) in that file, the first: {notes[0]}")
    for line in launch_problems(project):
        print(f"  to do: {line}")
    print(f"then: gguf-trainer plan --project {project.root}, and gguf-trainer start --project {project.root}")
    return 0

