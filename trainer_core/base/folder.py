"""A project folder: where every artifact lives, its settings, its state, the last project.

A folder is a project when it holds `project.json`. Everything a run needs stays inside
the folder (materials, corpus, shards, checkpoints, eval.json), so a reboot loses nothing;
the exported GGUFs go next to the folder unless `export.output_dir` says otherwise.

`ProjectFolder` knows no pack registry: the packs it validates settings against and hands out as
`project.pack` come from its `catalog`, which `trainer_core.project.Project` binds to the registry.
The contract and the packs take a `ProjectFolder`; only the layers above the packs import `Project`.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, ClassVar, Mapping, Protocol

from trainer_core.base.atomic import atomic_write_json, read_json
from trainer_core.base.diskspace import path_too_long
from trainer_core.base import config, token_store
from trainer_core.base.config import Settings
from trainer_core.base.errors import ConfigError, FolderError, NoProjectError, ProjectExistsError, TrainerError
from trainer_core.base.events import EventWriter, make_event
from trainer_core.base.locks import FileLock

__all__ = [
    "ProjectFolder", "PackCatalog", "user_dir", "default_projects_root", "remember_last_project", "last_project",
    "new_state", "repair_state", "folder_is_project", "adapter_name", "PROJECT_FILE", "DEMO_MARKER",
]


class PackCatalog(Protocol):
    """What a project folder needs of the packs: the packs by id (config.PackInfo and the hooks the
    pipeline calls), the default one, and the lookup that names the known ones when an id is not."""

    packs: Mapping[str, Any]
    default: str

    def get(self, pack_id: str) -> Any: ...


PROJECT_FILE = "project.json"
DEMO_MARKER = ".demo.json"       # in materials/ of a demo project (a dot-file: never taken for a material's file)
TOKEN_KEY = "hf_token"           # a setting kept out of project.json (base/token_store.py)
# settings whose change makes a project's shards stale (the pack, the synthetic targets, the student's and
# the teacher's files), and with them the checkpoints trained on them
INVALIDATING = ("pack", "precompute.mock_teacher")
INVALIDATING_MATERIALS = ("materials.student.", "materials.student_tokenizer.", "materials.teacher.",
                          "materials.klein_encoder.")


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def user_dir() -> Path:
    """Per-user settings folder: $GGUF_TRAINER_HOME, else ~/.gguf-trainer."""
    env = os.environ.get("GGUF_TRAINER_HOME")
    return Path(env) if env else Path.home() / ".gguf-trainer"


def cache_dir() -> Path:
    """What the trainer can rebuild and keeps only to save time (the offline demo's tokenizer):
    $GGUF_TRAINER_CACHE, else $XDG_CACHE_HOME/gguf-trainer, else ~/.cache/gguf-trainer."""
    env = os.environ.get("GGUF_TRAINER_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gguf-trainer"


def default_projects_root() -> Path:
    return Path.home() / "gguf-trainer" / "projects"


def remember_last_project(root: Path) -> None:
    path = user_dir() / "settings.json"
    data = read_json(path, {})
    data = data if isinstance(data, dict) else {}
    data["last_project"] = str(Path(root).resolve())
    atomic_write_json(path, data)


def last_project() -> Path | None:
    data = read_json(user_dir() / "settings.json", {})
    value = data.get("last_project") if isinstance(data, dict) else None
    return Path(value) if isinstance(value, str) and value else None


def _adopt_token(root: Path, legacy: str) -> str:
    """The project's token: a value an older version left in project.json moves to .hf_token (where the
    folder is writable; else it is used from where it is), otherwise what .hf_token holds."""
    if legacy:
        try:
            token_store.write_token(root, legacy)
        except (OSError, TrainerError):       # read-only or full: used from project.json as it is
            return legacy
    return token_store.read_token(root)


def folder_is_project(path: str | os.PathLike) -> bool:
    return (Path(path) / PROJECT_FILE).is_file()


def new_state() -> dict[str, Any]:
    return {"status": "idle", "stage": None, "stages": {}, "error": None, "pid": None}


# the type each known key of state.json must have (None allowed); other keys are kept as they are
_TEXT, _NUMBER, _INT = (str,), (int, float), (int,)
_STATE_KEYS = {"status": _TEXT, "stage": _TEXT, "error": _TEXT, "run": _TEXT, "host": _TEXT, "pid": _INT,
               "started": _NUMBER, "finished": _NUMBER, "updated": _NUMBER}
_STAGE_KEYS = {"status": _TEXT, "detail": _TEXT, "error": _TEXT, "unit": _TEXT, "count": _NUMBER, "total": _NUMBER,
               "step": _NUMBER, "planned_steps": _NUMBER, "val_cos": _NUMBER, "best_val_cos": _NUMBER,
               "eta_s": _NUMBER, "rate": _NUMBER, "started": _NUMBER, "finished": _NUMBER, "updated": _NUMBER}


def _fits(value: Any, types: tuple[type, ...]) -> bool:
    return value is None or (isinstance(value, types) and not isinstance(value, bool))


def repair_state(raw: Any) -> tuple[dict[str, Any], list[str]]:
    """`raw` (state.json as parsed) as a valid state, and what had to be dropped. A value of the wrong
    type is dropped, not guessed: which stages are done comes from the files on disk anyway."""
    if not isinstance(raw, dict):
        return new_state(), ["it is not a JSON object" + (f" (a {type(raw).__name__})" if raw is not None else "")]
    state, problems = dict(raw), []
    for key, types in _STATE_KEYS.items():
        if not _fits(state.get(key), types):
            problems.append(f"{key} was {json.dumps(state.pop(key), default=str)[:60]}")
    stages = state.get("stages", {})
    if not isinstance(stages, dict):
        problems.append(f"stages was {json.dumps(stages, default=str)[:60]}")
        stages = {}
    state["stages"] = {}
    for name, entry in stages.items():
        if not isinstance(entry, dict):
            problems.append(f"stages.{name} was {json.dumps(entry, default=str)[:60]}")
            continue
        bad = [k for k, types in _STAGE_KEYS.items() if not _fits(entry.get(k), types)]
        problems += [f"stages.{name}.{k} was {json.dumps(entry[k], default=str)[:60]}" for k in bad]
        state["stages"][name] = {k: v for k, v in entry.items() if k not in bad}
    return {**new_state(), **state}, problems


def adapter_name(folder: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", folder).strip("._-") or "adapter"
    return name if name.startswith("pig_") else "pig_" + name


def path_problems(root: Path, settings: Settings) -> list[str]:
    """One sentence per path setting the filesystem cannot hold (a name or a whole path too long), so `set` and
    the GUI form refuse it before anything is written."""
    s = settings
    named = [("export.output_dir", s.export.output_dir), ("export.copy_to", s.export.copy_to),
             ("corpus.train_file", s.corpus.train_file), ("corpus.val_file", s.corpus.val_file),
             *((f"corpus.extra_files[{i}]", f) for i, f in enumerate(s.corpus.extra_files)),
             *((f"materials.{m}.path", o.path) for m, o in s.materials.items())]
    problems = []
    for key, text in named:
        if not isinstance(text, str) or not text:
            continue
        problem = path_too_long(key, Path(os.path.normpath(root / os.path.expanduser(text))))
        if problem:
            problems.append(problem)
    return problems


class ProjectFolder:
    """An opened project: its folder, validated settings and the paths of every artifact. `catalog` (a
    PackCatalog) is set by the subclass that binds the pack registry (trainer_core.project.Project)."""

    catalog: ClassVar[PackCatalog]

    def __init__(self, root: Path, settings: Settings):
        self.root = root
        self.settings = settings

    # ------------------------------------------------------------ create / open
    @classmethod
    def create(cls, root: str | os.PathLike, pack_id: str, name: str | None = None) -> "ProjectFolder":
        root = Path(root).expanduser().resolve()
        pack = cls.catalog.get(pack_id)
        if folder_is_project(root):
            current = read_json(root / PROJECT_FILE, {})
            which = current.get("pack", "?") if isinstance(current, dict) else "?"
            raise ProjectExistsError(
                f"{root} is already a project (pack {which}); open it instead, or pick another folder."
            )
        if root.exists() and not root.is_dir():
            raise NoProjectError(f"{root} is a file, not a folder; pick a folder for the new project.")
        raw = config.default_settings_dict(pack)
        raw["name"] = name if name is not None else adapter_name(root.name)
        settings = cls.settings_from_dict(raw)  # validates a user-given name
        try:
            root.mkdir(parents=True, exist_ok=True)
            for lock in (root / ".settings.lock", root / ".run.lock"):
                lock.touch()
        except OSError as e:          # read-only, not ours, a file in the way: one sentence
            from trainer_core.base.diskspace import disk_error
            raise (disk_error(e, root) or e) from None
        project = cls(root, settings)
        project.save_settings(settings)
        project.write_state(new_state())
        remember_last_project(root)
        return project

    @classmethod
    def open(cls, root: str | os.PathLike) -> "ProjectFolder":
        root = Path(root).expanduser().resolve()
        project = cls(root, cls._load_settings(root))
        project._drop_legacy_token()
        return project

    def _drop_legacy_token(self) -> None:
        """A project.json from an older version may hold `hf_token`: _load_settings moved it to .hf_token;
        rewrite project.json without it, once, under the settings lock (a read-only folder keeps it, still used)."""
        raw = read_json(self.project_json, None)
        if not (isinstance(raw, dict) and TOKEN_KEY in raw):
            return
        try:
            with FileLock(self.root / ".settings.lock"):
                self.save_settings(self.reload())
        except (OSError, TrainerError):     # not writable (read-only, full): the token is still read from there
            pass

    @classmethod
    def settings_from_dict(cls, raw: Any) -> Settings:
        """Validate a project.json object (merged over the defaults of its pack) into Settings."""
        return config.settings_from_dict(raw, cls.catalog.packs, cls.catalog.default)

    @classmethod
    def apply_assignments(cls, raw: dict, assignments: list[str]) -> tuple[dict, Settings]:
        """`key=value` assignments over `raw`, validated with the pack's overlay (see config)."""
        return config.apply_assignments(raw, assignments, cls.catalog.packs, cls.catalog.default)

    @classmethod
    def _load_settings(cls, root: Path) -> Settings:
        path = root / PROJECT_FILE
        if root.exists() and not root.is_dir():
            raise NoProjectError(f"{root} is a file, not a project folder; pick the project's folder.")
        if not root.is_dir():
            raise NoProjectError(
                f"There is no project at {root}: the folder does not exist; "
                f"create one with `gguf-trainer new --project {root} --pack PACK`."
            )
        if not path.is_file():
            raise NoProjectError(
                f"{root} is not a gguf-trainer project (it has no project.json); pick the project "
                f"folder itself, or create one with `gguf-trainer new --project {root} --pack PACK`."
            )
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ConfigError([f"{path} is not UTF-8 text; restore it from a backup or recreate the project"]) from None
        except json.JSONDecodeError as e:
            raise ConfigError([
                f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); fix the file "
                f"or recreate the project"
            ]) from None
        except OSError as e:
            raise NoProjectError(f"{path} cannot be read ({e.strerror}); check its permissions.") from None
        if isinstance(raw, dict) and isinstance(raw.get(TOKEN_KEY, ""), str):   # the token lives in .hf_token
            raw[TOKEN_KEY] = _adopt_token(root, raw.pop(TOKEN_KEY, ""))
        try:
            return cls.settings_from_dict(raw)
        except ConfigError as e:
            raise ConfigError([f"{path}: {p}" for p in e.problems]) from None

    def reload(self) -> Settings:
        self.settings = self._load_settings(self.root)
        return self.settings

    @property
    def pack(self) -> Any:
        """The project's pack (packs/base.TrainerPack)."""
        return self.catalog.get(self.settings.pack)

    # ------------------------------------------------------------ settings
    def save_settings(self, settings: Settings) -> None:
        """project.json, and the token in .hf_token (0600): never in project.json, which gets copied and shared."""
        token_store.write_token(self.root, settings.hf_token)
        atomic_write_json(self.project_json, {k: v for k, v in settings.to_dict().items() if k != TOKEN_KEY})
        self.settings = settings

    def update_settings(self, assignments: list[str]) -> tuple[Settings, Settings]:
        """Apply `key=value` assignments under the settings lock; returns (before, after).

        The file is re-read inside the lock, so a GUI save and a CLI `set` never lose each
        other's change; nothing is written unless every assignment is valid.
        """
        with FileLock(self.root / ".settings.lock"):
            before = self.reload()
            _, after = self.apply_assignments(before.to_dict(), assignments)
            problems = path_problems(self.root, after)
            if problems:
                raise ConfigError(problems)
            self.save_settings(after)
        return before, after

    def work_at_risk(self, assignments: list[str]) -> tuple[list[str], list[str]]:
        """(the settings among `assignments` whose change makes the shards and the checkpoints trained on
        them stale, what of that work exists now); either list may be empty. Validates like update_settings."""
        _, after = self.apply_assignments(self.settings.to_dict(), assignments)
        problems = path_problems(self.root, after)
        if problems:
            raise ConfigError(problems)
        b, a = _flat(self.settings.to_dict()), _flat(after.to_dict())
        changed = [f"{key} ({b.get(key)} → {a.get(key)})" for key in sorted(set(a) | set(b))
                   if (key in INVALIDATING or key in self.pack.invalidating or key.startswith(INVALIDATING_MATERIALS))
                   and a.get(key) != b.get(key)]
        shards = [p for split in ("train", "val") if self.shards_dir(split).is_dir()
                  for p in self.shards_dir(split).glob("*.safetensors")]
        work = ([f"{len(shards)} precomputed shard(s) in {self.root / 'shards'}"] if shards else []) + (
            [f"the checkpoints in {self.checkpoints_dir}"] if self.checkpoints_dir.is_dir()
            and any(self.checkpoints_dir.iterdir()) else [])
        return changed, work

    # ------------------------------------------------------------ state
    def read_state(self) -> dict[str, Any]:
        """state.json, always of the right shape: a damaged file (not JSON, a wrong type anywhere) is
        rebuilt, written back and reported once, as a warning in events.jsonl."""
        raw = read_json(self.state_json, None)
        if raw is None and not self.state_json.is_file():
            return new_state()
        state, problems = repair_state(raw)
        if problems:
            self._rebuilt_state(state, problems)
        return state

    def _rebuilt_state(self, state: dict[str, Any], problems: list[str]) -> None:
        message = (f"state.json was damaged ({'; '.join(problems[:5])}{'; …' if len(problems) > 5 else ''}); "
                   f"rebuilt it: which stages are done is read from the files on disk")
        try:              # a read-only folder: the repaired state is still what the caller gets
            self.write_state(dict(state))
            with EventWriter(self.events_jsonl) as events:
                events.write(make_event("log", {"level": "warning", "message": message}))
        except OSError:
            pass

    def write_state(self, state: dict[str, Any]) -> None:
        state["updated"] = time.time()
        state.setdefault("host", socket.gethostname())
        atomic_write_json(self.state_json, state)

    # ------------------------------------------------------------ paths
    @property
    def project_json(self) -> Path:
        return self.root / PROJECT_FILE

    @property
    def state_json(self) -> Path:
        return self.root / "state.json"

    @property
    def events_jsonl(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def pipeline_log(self) -> Path:
        return self.root / "pipeline.log"

    @property
    def pipeline_pid(self) -> Path:
        return self.root / "pipeline.pid"

    @property
    def stage_pid(self) -> Path:
        return self.root / "stage.pid"

    @property
    def run_lock(self) -> Path:
        return self.root / ".run.lock"

    @property
    def stop_file(self) -> Path:
        return self.root / "STOP"

    @property
    def snapshot_file(self) -> Path:
        return self.root / "SNAPSHOT"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def materials_dir(self) -> Path:
        return self.root / "materials"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def eval_json(self) -> Path:
        return self.root / "eval.json"

    @property
    def is_demo(self) -> bool:
        """A demo project (`gguf-trainer demo`): tiny random stand-in models, its figures no score."""
        return (self.materials_dir / DEMO_MARKER).is_file()

    @property
    def snapshots_json(self) -> Path:
        return self.root / "snapshots.json"

    def shards_dir(self, split: str) -> Path:
        return self.root / "shards" / split

    def check_layout(self) -> None:
        """Refuse to run on a project whose own files and folders were replaced by the wrong kind of entry
        (a folder where it keeps a file, a file where it keeps a folder), or whose export would land on one:
        FolderError naming the path and what to do, before anything is written."""
        files = {self.events_jsonl: "its event log", self.state_json: "the run's state",
                 self.pipeline_log: "the pipeline log", self.eval_json: "the evaluation",
                 self.gguf_path(): "the exported adapter",
                 self.shards_dir("train") / "CONTRACT": "the train shards' contract",
                 self.shards_dir("val") / "CONTRACT": "the val shards' contract"}
        folders = {self.data_dir: "the corpus", self.materials_dir: "the materials",
                   self.checkpoints_dir: "the checkpoints", self.root / "shards": "the precomputed shards",
                   self.shards_dir("train"): "the train shards", self.shards_dir("val"): "the val shards"}
        e = self.settings.export
        for key, text in (("export.output_dir", e.output_dir), ("export.copy_to", e.copy_to)):
            path = self.resolve_user_path(text) if text else None
            if path is not None and path.exists() and not path.is_dir():
                raise FolderError(f"{key} names {path}, which is a file; the export writes into a folder: set "
                                  f"{key} to a folder (`gguf-trainer set --project {self.root} --set {key}=DIR`).")
        for path, what in {**files, **folders}.items():
            if path.is_symlink() and not path.exists():
                raise FolderError(f"{path}, where gguf-trainer keeps {what}, is a link to {os.readlink(path)}, which "
                                  "does not exist; remove the link (or restore what it points to) and run again.")
        for path, what in files.items():
            if path.is_dir():
                raise FolderError(f"{path} is a folder where gguf-trainer keeps {what}; move it out of the way (or "
                                  "delete it) and run again.")
        for path, what in folders.items():
            if path.exists() and not path.is_dir():
                raise FolderError(f"{path} is a file where gguf-trainer keeps {what}; move it out of the way (or "
                                  "delete it), or change the setting, and run again.")

    def corpus_files(self) -> tuple[Path, Path]:
        """(train, val) corpus files: the user's own in files mode, else those under data/."""
        c = self.settings.corpus
        if self.pack.corpus_kind.reference_images:
            return self.data_dir / "train.jsonl", self.data_dir / "val.jsonl"
        if c.mode == "files":
            return self.resolve_user_path(c.train_file), self.resolve_user_path(c.val_file)
        return self.data_dir / "train.txt", self.data_dir / "val.txt"

    def resolve_user_path(self, text: str) -> Path:
        """A path the user typed: `~` expanded, relative paths taken from the project folder."""
        path = Path(os.path.expanduser(text))
        return Path(os.path.normpath(path if path.is_absolute() else self.root / path))

    def output_dir(self) -> Path:
        out = self.settings.export.output_dir
        return self.resolve_user_path(out) if out else self.root.parent

    def gguf_path(self, step: int | None = None) -> Path:
        tag = f"-step{step}" if step is not None else ""
        return self.output_dir() / f"{self.settings.name}{tag}-f16.gguf"

    def card_path(self) -> Path:
        """The model card beside the exports (published as the repo's README.md). Named for the adapter: the
        output folder is the projects' parent by default, which sibling projects share."""
        return self.output_dir() / f"{self.settings.name}-README.md"

    def card_plot_path(self) -> Path:
        """The card's quality-vs-steps plot, beside it."""
        return self.output_dir() / f"{self.settings.name}-quality.png"
