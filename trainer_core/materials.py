"""Materials: what a pack needs on disk, whether it is there, finding copies the user already has, and resumable
downloads from the Hugging Face Hub.

Status: `ready` / `partial` / `downloading` / `missing`, with bytes and file counts. Online it is decided against
the Hub's file listing (every file the allow-patterns select must be on disk with the listed size); offline, from
the disk alone (every pattern matches a file and no partial download is left). Before listing, one request without
retries checks that the Hub answers at all: unreachable, the statuses come from the disk at once, said in one line
(a listing retries a dead connection for ~23 s, with a warning line per try, per material).

Downloads keep one partial file per Hub file (`<dest>/.partial/<path>`) and continue it with an HTTP Range
request, then check size and sha256 (LFS) or the git blob id (small files) before moving it into place, so a
kill, a crash or a reboot never costs the bytes already fetched (huggingface_hub restarts an interrupted file
from byte 0). A read that sees no byte for `GGUF_TRAINER_STALL_S` seconds (default 60) is abandoned and resumed
where it stopped. The Hub address is `HF_ENDPOINT` read at call time; the token is the project's own
(`.hf_token`) or the Hugging Face token store's (base/token_store.py) and is never logged.

Jobs: `python -m trainer_core.materials --project DIR --id ID` runs detached (jobs.py: its pid, status and log
are `materials/.downloads/<id>.pid|.status|.log`), holding `materials/.downloads/<id>.lock` for its whole life:
a second job for the same material finds the lock held and exits at once, so two requests never make two
downloads. Whether a download runs is decided by that lock; a job that died is not a failure: it resumes.

A demo project (`materials/.demo.json`, by demo.py) never reaches the Hub: its tiny local models
are `ready` where they lie, one it runs without (a mocked teacher) `not needed`; no discovery, no download.
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from trainer_core.base import token_store
from trainer_core.base.atomic import atomic_write_json
from trainer_core.base.errors import first_line, TrainerError, UsageError
from trainer_core.base.events import Report, Reporter
from trainer_core.base.folder import DEMO_MARKER
from trainer_core.base.locks import FileLock
from trainer_core.hub import OFFLINE_MODE, HubFile, endpoint, hub_unreachable, list_files, selected as _selected
from trainer_core.jobs import JobFiles, JobReport, launch, read_status, run_job as run_detached
from trainer_core.project import Project, default_projects_root
from trainer_core.packs.lookup import find_material, resolve_material

if TYPE_CHECKING:
    from trainer_core.packs.base import Material

__all__ = ["HubFile", "MaterialStatus", "list_files", "material_status", "all_statuses", "discover", "adopt_existing",
           "download", "as_say", "start_job", "job_running", "job_files", "run_job", "material_lock", "wanted",
           "DownloadError", "MATERIALS_ENV", "PARTIAL_DIR", "DEMO_MARKER", "DEMO_OFFLINE", "mark_demo", "is_demo",
           "hub_unreachable", "fetch_verified"]

MATERIALS_ENV, STALL_ENV = "GGUF_TRAINER_MATERIALS", "GGUF_TRAINER_STALL_S"
PARTIAL_DIR, CHUNK = ".partial", 1 << 20
DEMO_OFFLINE = "This is the offline demo: it runs on the tiny local models it was built with; nothing is downloaded."


class DownloadError(TrainerError):
    """A download the Hub refused, that failed its size or hash check, or that does not fit."""


@dataclass
class MaterialStatus:
    id: str
    title: str
    kind: str
    required: bool
    status: str                  # ready | partial | downloading | missing | not needed (a demo runs without it)
    path: str | None
    bytes_done: int = 0
    bytes_total: int | None = None
    files_done: int = 0
    files_total: int | None = None
    linked: bool = False
    online: bool = False
    error: str | None = None     # the last failed download's first line
    hub: str | None = None       # why the Hub was not asked, when it was to be (unreachable, offline mode)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ------------------------------------------------------------ the Hub side

def token_for(project: Project) -> str | None:
    return token_store.resolve(project.settings.hf_token)


# ------------------------------------------------------------ status

def mark_demo(project: Project, pack_id: str) -> None:
    atomic_write_json(project.materials_dir / DEMO_MARKER, {"demo": True, "pack": pack_id})


def is_demo(project: Project) -> bool:
    return project.is_demo


def downloads_dir(project: Project) -> Path:
    return project.materials_dir / ".downloads"


def _lock_path(project: Project, material_id: str) -> Path:
    return downloads_dir(project) / f"{material_id}.lock"


def job_files(project: Project, material_id: str) -> JobFiles:
    base = downloads_dir(project)
    return JobFiles(status=base / f"{material_id}.status", pid=base / f"{material_id}.pid",
                    log=base / f"{material_id}.log", what=f"the download of {material_id}")


def job_running(project: Project, material_id: str) -> bool:
    """A job holds the material's lock for its whole life."""
    lock_path = _lock_path(project, material_id)
    if not lock_path.exists():
        return False
    probe = FileLock(lock_path)
    if probe.acquire():
        probe.release()
        return False
    return True


def _partial_bytes(dest: Path) -> int:
    folder = dest / PARTIAL_DIR
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def _local_files(dest: Path, patterns: tuple[str, ...]) -> dict[str, int]:
    """{path inside dest: size} of the finished files the patterns select (a snapshot folder can
    hold several materials: LLaDA's teacher and SigVQ share one)."""
    if not dest.is_dir():
        return {}
    found = {}
    for root, _, names in os.walk(dest):     # unlike rglob, a folder that vanishes mid-walk is skipped
        for p in (Path(root) / n for n in names if not n.startswith(".")):
            with contextlib.suppress(OSError):                 # gone since, or a dangling link
                if PARTIAL_DIR not in p.parts and _selected(rel := str(p.relative_to(dest)), patterns):
                    found[rel] = p.stat().st_size
    return found


def _offline_complete(dest: Path, patterns: tuple[str, ...], files: dict[str, int] | None = None) -> bool:
    """Every pattern matches a finished file and no partial download is left."""
    files = _local_files(dest, patterns) if files is None else files
    return bool(files) and not _partial_bytes(dest) and all(
        any(fnmatch.fnmatch(f, pat) for f in files) for pat in (patterns or ("*",)))


def material_status(project: Project, material: "Material", listing: list[HubFile] | None = None) -> MaterialStatus:
    """The material's status; `listing` (from list_files) decides it online, None offline."""
    override = project.settings.materials.get(material.id)
    linked = bool(override and override.path)
    try:
        where = resolve_material(project, material.id)
    except TrainerError:
        where = None
    st = MaterialStatus(material.id, material.title, material.kind, material.required, "missing",
                        str(where) if where else None, linked=linked, online=listing is not None)
    # as recorded: a job that died left resumable partial files, not a failure to show
    job = read_status(job_files(project, material.id), liveness=False)
    if job.get("status") == "failed":
        st.error = str(job.get("error", "")).splitlines()[0] if job.get("error") else "failed"
    if is_demo(project):
        files = ({where.name: where.stat().st_size} if where is not None and where.is_file() else
                 _local_files(where, material.patterns) if where is not None and material.kind == "hf_snapshot" else {})
        st.status, st.bytes_done, st.files_done = "ready" if files else "not needed", sum(files.values()), len(files)
        return st
    dest = where
    if material.kind == "local_file":          # picked, linked, or fetched from the Hub (student_hub.py)
        if where is not None and where.is_file():
            st.status, st.bytes_done, st.bytes_total, st.files_done, st.files_total = "ready", where.stat().st_size, \
                where.stat().st_size, 1, 1
    elif listing is not None and dest is not None:
        st.files_total, st.bytes_total = len(listing), sum(f.size for f in listing)
        for f in listing:
            path = dest / f.path
            if path.is_file() and (f.size == 0 or path.stat().st_size == f.size):
                st.files_done += 1
                st.bytes_done += f.size
        st.bytes_done += _partial_bytes(dest)
        complete = st.files_done == st.files_total and st.files_total > 0
        st.status = "ready" if complete else ("partial" if st.bytes_done else "missing")
    elif dest is not None:
        files = _local_files(dest, material.patterns)
        st.bytes_done = sum(files.values()) + _partial_bytes(dest)
        st.status = "ready" if _offline_complete(dest, material.patterns, files) else (
            "partial" if st.bytes_done else "missing")
    if st.status != "ready" and job_running(project, material.id):
        st.status = "downloading"
        st.bytes_done = max(st.bytes_done, int((job.get("progress") or {}).get("count", 0)))
        st.bytes_total = st.bytes_total or (job.get("progress") or {}).get("total")
    return st


def wanted(project: Project, material: "Material") -> bool:
    if material.required:
        return True
    section, _, name = material.wanted_if.partition(".")      # an optional material a pack setting asks for
    return bool(getattr(getattr(project.settings, section), name)) if material.wanted_if else True


def all_statuses(project: Project, online: bool = True) -> list[MaterialStatus]:
    """Every material's status; online lists each snapshot on the Hub once `hub_unreachable` found it answers
    (else, and after a listing lost the connection, from the disk, said in one line on stderr)."""
    from huggingface_hub.utils import httpx
    out, wanted_online = [], online and not is_demo(project)
    token, materials = token_for(project), project.pack.project_materials(project)
    problem = hub_unreachable() if wanted_online and any(m.kind == "hf_snapshot" for m in materials) else None
    for m in materials:
        listing = None
        if wanted_online and not problem and m.kind == "hf_snapshot":
            try:
                listing = list_files(m, token)
            except httpx.TransportError as e:       # it went away (after its retries): no other listing tries
                problem = first_line(e)
            except Exception:       # noqa: BLE001 — refused, gated, no such repo: this one from the disk
                listing = None
        out.append(material_status(project, m, listing))
        out[-1].hub = problem if wanted_online and m.kind == "hf_snapshot" and listing is None else None
    if problem and problem != OFFLINE_MODE:
        print(f"gguf-trainer: the Hugging Face Hub ({endpoint()}) cannot be reached ({problem}); the materials' "
              f"statuses come from the disk", file=sys.stderr, flush=True)
    return out


# ------------------------------------------------------------ discovery

def _candidate_roots(project: Project) -> list[Path]:
    roots: list[Path] = []
    if os.environ.get(MATERIALS_ENV):
        roots.append(Path(os.environ[MATERIALS_ENV]).expanduser())
    cwd = Path.cwd()
    roots += [cwd, cwd / "materials", project.root, project.root.parent]
    for parent in (project.root.parent, default_projects_root()):
        if parent.is_dir():
            roots += [d / "materials" for d in sorted(parent.iterdir())
                      if d.is_dir() and d != project.root and (d / "materials").is_dir()]
    seen, unique = set(), []
    for r in roots:
        try:
            key = r.resolve()
        except OSError:
            continue
        if key not in seen and key.is_dir() and not (key / DEMO_MARKER).exists():   # a demo's are not real
            seen.add(key)
            unique.append(key)
    return unique


def discover(project: Project, material: "Material") -> Path | None:
    """A complete copy of the material somewhere the user keeps files, or None."""
    roots = _candidate_roots(project)
    if material.kind == "local_file":
        found = []
        for root in [*roots, project.materials_dir]:
            if root.is_dir():
                found += [p for p in root.glob("pig_clip*") if p.is_file() and p.suffix.lower() in
                          (material.suffixes or (".gguf",))]
        if not found:
            return None
        return max(found, key=lambda p: ("f16" in p.name.lower(), p.stat().st_size)).resolve()
    own = resolve_material(project, material.id)
    for root in roots:
        for candidate in (root / (material.subdir or material.repo.rsplit("/", 1)[-1]), root):
            if own is not None and candidate.resolve() == own.resolve():
                continue
            if _offline_complete(candidate, material.patterns):
                return candidate.resolve()
    return None


def adopt_existing(project: Project) -> list[tuple[str, Path]]:
    """Link found copies of materials that are not complete at their own path and not being
    downloaded (a path override in project.json; nothing is copied). Returns what was linked; a
    demo project links nothing (its materials are its own)."""
    linked: list[tuple[str, Path]] = []
    if is_demo(project):
        return linked
    for m in project.pack.project_materials(project):
        if job_running(project, m.id) or material_status(project, m).status == "ready":
            continue
        found = discover(project, m)
        if found is not None:
            project.update_settings([f"materials.{m.id}.path={found}"])
            linked.append((m.id, found))
    return linked


# ------------------------------------------------------------ downloading

def _git_blob_id(path: Path) -> str:
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _verify(path: Path, f: HubFile) -> str | None:
    if path.stat().st_size != f.size:
        return f"{f.path}: {path.stat().st_size} bytes, the Hub lists {f.size}"
    if f.sha256 and _sha256(path) != f.sha256:
        return f"{f.path}: sha256 differs from the Hub's"
    if not f.sha256 and f.blob_id and _git_blob_id(path) != f.blob_id:
        return f"{f.path}: content differs from the Hub's (git blob id)"
    return None


def _fetch(material: "Material", f: HubFile, part: Path, token: str | None, stall_s: float,
           progress: Callable[[int], None], say: Callable[[dict[str, Any]], None]) -> None:
    """Append the rest of `f` to `part` with Range requests; on a stall or a dropped connection,
    resume from what arrived (up to 20 tries without progress)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, httpx
    url = hf_hub_url(material.repo, f.path, repo_type=material.repo_type, endpoint=endpoint())
    part.parent.mkdir(parents=True, exist_ok=True)
    fruitless = 0
    while True:
        have = part.stat().st_size if part.exists() else 0
        if have >= f.size:
            return
        headers = {**build_hf_headers(token=token), "Range": f"bytes={have}-"}
        before = have
        try:
            timeout = httpx.Timeout(connect=30.0, read=stall_s, write=30.0, pool=30.0)
            with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as r:
                if r.status_code == 416:
                    return
                if r.status_code == 200 and have:        # the server ignored the Range: start over
                    part.unlink()
                elif r.status_code not in (200, 206):
                    raise DownloadError(f"{material.repo}/{f.path}: the Hub answered HTTP {r.status_code}")
                with open(part, "ab") as out:
                    for block in r.iter_bytes():        # as it arrives: a stall keeps every byte received
                        out.write(block)
                        progress(len(block))
                    out.flush()
                    os.fsync(out.fileno())
        except (httpx.TimeoutException, httpx.TransportError) as e:
            got = (part.stat().st_size if part.exists() else 0) - before
            fruitless = 0 if got > 0 else fruitless + 1
            say({"type": "log", "level": "warning", "message":
                 f"{f.path}: {type(e).__name__} after {got} new bytes; resuming at byte {before + got}"})
            if fruitless >= 20:
                raise DownloadError(f"{material.repo}/{f.path}: no progress after 20 tries "
                                    f"({type(e).__name__})") from None


def download(project: Project, material: "Material", say: Callable[[dict[str, Any]], None] = lambda e: None,
             dest: Path | None = None, listing: list[HubFile] | None = None) -> None:
    """Fetch what is missing of an hf_snapshot material into `dest` (its own place by default; resuming partial
    files; `listing`: the Hub's files, when listed already), checking free disk space first."""
    if is_demo(project):
        raise UsageError(DEMO_OFFLINE)
    if material.kind != "hf_snapshot":
        raise UsageError(f"{material.title} is a local file: pick it in the GUI or set materials.{material.id}.path.")
    dest = dest if dest is not None else resolve_material(project, material.id)
    token = token_for(project)
    files = listing if listing is not None else list_files(material, token)
    if not files:
        raise DownloadError(f"{material.repo} has no file matching {', '.join(material.patterns)}.")
    todo = [f for f in files if not ((dest / f.path).is_file() and (dest / f.path).stat().st_size == f.size)]
    have = {f.path: ((dest / PARTIAL_DIR / f.path).stat().st_size if (dest / PARTIAL_DIR / f.path).is_file() else 0)
            for f in todo}
    needed = sum(f.size - have[f.path] for f in todo)
    probe = dest
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise DownloadError(f"{material.title} needs {needed / 2**30:.2f} GiB more but {probe} has only "
                            f"{free / 2**30:.2f} GiB free; free some space and press Download again.")
    total = sum(f.size for f in files)
    done = [total - needed]
    started, last = time.monotonic(), [0.0]
    stall_s = float(os.environ.get(STALL_ENV, "60"))

    def progress(n: int) -> None:
        done[0] += n
        now = time.monotonic()
        if now - last[0] >= 0.5:
            last[0] = now
            rate = (done[0] - (total - needed)) / max(now - started, 1e-6)
            say({"type": "progress", "count": done[0], "total": total, "unit": "bytes", "rate": round(rate),
                 "eta_s": round((total - done[0]) / rate, 1) if rate > 0 else None})
    for f in todo:
        part = dest / PARTIAL_DIR / f.path
        _fetch(material, f, part, token, stall_s, progress, say)
        problem = _verify(part, f)
        if problem:
            part.unlink(missing_ok=True)
            raise DownloadError(f"{problem}; the partial file was removed, press Download again.")
        target = dest / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, target)
        say({"type": "log", "level": "info", "message": f"{f.path} ({f.size} bytes) verified"})
    shutil.rmtree(dest / PARTIAL_DIR, ignore_errors=True)
    say({"type": "progress", "count": total, "total": total, "unit": "bytes"})


def fetch_verified(material: "Material", f: HubFile, folder: Path, token: str | None,
                   say: Callable[[dict[str, Any]], None] = lambda e: None) -> Path:
    """One Hub file of `material` into `folder` as download() fetches each (resumable, the free space checked
    first, the Hub's size and hash after), renamed into place; returns its path."""
    part, free = folder / PARTIAL_DIR / Path(f.path).name, shutil.disk_usage(folder).free
    if f.size > free:
        raise DownloadError(f"{material.repo}/{f.path} needs {f.size / 2**30:.2f} GiB but {folder} has only "
                            f"{free / 2**30:.2f} GiB free.")
    _fetch(material, f, part, token, float(os.environ.get(STALL_ENV, "60")), lambda n: None, say)
    problem = _verify(part, f)
    if problem:
        part.unlink(missing_ok=True)
        raise DownloadError(f"{problem}; the partial file was removed, try again.")
    os.replace(part, folder / part.name)
    return folder / part.name


# ------------------------------------------------------------ jobs

def start_job(project: Project, material_id: str) -> int | None:
    """Launch the detached download job of one material; None when one is already running."""
    material = find_material(project.pack, material_id)
    if is_demo(project):
        raise UsageError(DEMO_OFFLINE)
    if material.kind != "hf_snapshot":
        raise UsageError(f"{material.title} is a local file; it cannot be downloaded.")
    if job_running(project, material_id):
        return None
    token = token_for(project)
    env = {"HF_TOKEN": token} if token else None    # in the environment, never on the command line
    argv = [sys.executable, "-m", "trainer_core.materials", "--project", str(project.root), "--id", material_id]
    return launch(job_files(project, material_id), argv, cwd=project.root, env=env)


@contextlib.contextmanager
def material_lock(project: Project, material_id: str) -> Iterator[bool]:
    """Hold the material's download lock for the block; yields False (holding nothing) when a job
    or a foreground download already has it."""
    path = _lock_path(project, material_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    if not lock.acquire():
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def as_say(report: Report) -> Callable[[dict[str, Any]], None]:
    """`download`'s callback (flat {"type", ...} dicts, what the CLI's progress line reads) as
    events through `report`."""
    def say(event: dict[str, Any]) -> None:
        report(event["type"], **{k: v for k, v in event.items() if k != "type"})
    return say


def run_job(project: Project, material_id: str) -> int:
    """The job's body: hold the lock, download, record the outcome in the status file."""
    with material_lock(project, material_id) as held:
        if not held:    # the other job owns the status file: say so in the log only
            Reporter()("log", level="info", message="another job is downloading this material")
            return 0
        report = JobReport(job_files(project, material_id))
        # every failure (the Hub, the network, the disk) is a message for the user, not a bug
        return run_detached(report, lambda: download(project, find_material(project.pack, material_id),
                                                     as_say(report)), expected=(Exception,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_core.materials")
    parser.add_argument("--project", required=True)
    parser.add_argument("--id", required=True)
    args = parser.parse_args(argv)
    try:
        project = Project.open(args.project)
        return run_job(project, args.id)
    except TrainerError as e:
        Reporter()("error", message=str(e))
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
