"""The checkpoints of a project: the only module that knows their file names and format.

    checkpoints/last.pt + last.json     the resumable state (model, optimizer, stream, RNG, …)
    checkpoints/best.pt + best.json     the same at the best validation so far
    checkpoints/history/step<N>.pt      kept steps (train.history): weights only, + step<N>.json
    checkpoints/metrics.jsonl, val.jsonl  the metric series of the train stage
    start/adapter.gguf + start/from.json  the adapter training starts from (`new --from-adapter`), and
                                          where it came from; read when no checkpoint is left to resume

A checkpoint is named by the user's words: `last`, `best` or `step<N>`. Every `.pt` carries
`format` (FORMAT); a file of another format is refused with a sentence, never misread. Every
`.pt` has a JSON sidecar (`Sidecar`) that readers without torch use: `trained_steps` is the
step the weights are at (`step` in the file), `planned_steps` the count in force when it was
saved. Sidecars of earlier versions wrote `steps` for the planned count; `Sidecar.from_dict`
still reads them.

A `.pt` is read back before it replaces the previous one (`save`), so a write that went wrong
never costs the checkpoint before it; a file damaged later is skipped on resume
(`load_resumable`: last, else best) with a sentence saying so.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_core.base.atomic import atomic_path, atomic_write_json, read_json
from trainer_core.base.errors import TrainerError, UsageError

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder

__all__ = [
    "FORMAT", "LAST", "BEST", "Sidecar", "CheckpointError", "DamagedCheckpointError", "CheckpointNameError",
    "weights_path", "exists", "mtime", "read_sidecar", "save", "load", "load_resumable", "save_kept_step",
    "kept_steps", "prune_kept_steps", "delete_kept_step", "series_path", "archive", "parse_name", "remove_temps",
    "start_path", "start_record_path", "read_start_record",
]

FORMAT = 1                 # of the .pt files; bump when their content changes meaning
LAST, BEST = "last", "best"
_HISTORY = "history"
_START = "start"


class CheckpointError(TrainerError):
    """A checkpoint that is missing, damaged, or of another format."""


class DamagedCheckpointError(CheckpointError, UsageError):
    """A checkpoint file that cannot be read, or is not a gguf-trainer checkpoint: a file to replace (exit code 2)."""


class NoCheckpointError(CheckpointError, UsageError):
    """A checkpoint asked for that is not there (no kept step of that name, nothing saved yet): exit code 2."""


class CheckpointNameError(CheckpointError, UsageError):
    """A checkpoint name that is none of last, best, step<N>: bad input (exit code 2)."""


@dataclass(frozen=True)
class Sidecar:
    """What a checkpoint's JSON sidecar says (read without torch)."""

    trained_steps: int
    planned_steps: int | None = None
    best_val_cos: float | None = None
    val_cos: float | None = None
    val: dict[str, Any] | None = None
    val_step: int | None = None
    time: float | None = None

    @classmethod
    def from_dict(cls, data: Any) -> "Sidecar | None":
        """A sidecar of this or an earlier version (`step`/`steps`); None if it is not one."""
        if not isinstance(data, dict) or not isinstance(data.get("step"), int):
            return None
        planned = data.get("planned_steps", data.get("steps"))
        return cls(trained_steps=data["step"], planned_steps=planned if isinstance(planned, int) else None,
                   best_val_cos=data.get("best_val_cos"), val_cos=data.get("val_cos"), val=data.get("val"),
                   val_step=data.get("val_step"), time=data.get("time"))

    def to_dict(self) -> dict[str, Any]:
        """The file's keys: `step` (the trained steps, as events and metrics spell it) and
        `planned_steps`."""
        out = asdict(self)
        out["step"] = out.pop("trained_steps")
        return out


def parse_name(which: str) -> str:
    """`last`, `best` or `step<N>`; anything else is a clear error."""
    if which in (LAST, BEST) or (which.startswith("step") and which[4:].isdigit()):
        return which
    raise CheckpointNameError(f'"{which}" is not a checkpoint; use last, best or step<N> (a kept step).')


def weights_path(project: "ProjectFolder", which: str) -> Path:
    """The `.pt` file of `last`, `best` or `step<N>` (a kept step)."""
    which = parse_name(which)
    if which in (LAST, BEST):
        return project.checkpoints_dir / f"{which}.pt"
    return project.checkpoints_dir / _HISTORY / f"{which}.pt"


def exists(project: "ProjectFolder", which: str) -> bool:
    return weights_path(project, which).is_file()


def mtime(project: "ProjectFolder", which: str) -> float | None:
    try:
        return weights_path(project, which).stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_sidecar(project: "ProjectFolder", which: str) -> Sidecar | None:
    return Sidecar.from_dict(read_json(weights_path(project, which).with_suffix(".json"), None))


def save(project: "ProjectFolder", which: str, record: dict[str, Any], sidecar: Sidecar) -> Path:
    """Write `record` (with FORMAT) as the checkpoint's `.pt`, then its sidecar; both atomic. The new
    file is read back (memory-mapped: its structure, not every byte) before it replaces the old one."""
    import torch
    path = weights_path(project, which)
    with atomic_path(path, needs=_tensor_bytes(record)) as tmp:
        with open(tmp, "wb") as f:          # a file object: a full disk raises OSError, not a bare RuntimeError
            torch.save({"format": FORMAT, **record}, f)
        try:
            back = _read_back(tmp)
        except Exception as e:
            raise DamagedCheckpointError(f"{path.name} was written but does not read back ({type(e).__name__}: "
                                         f"{_first_line(e)}); the previous {path.name} is kept.") from None
        if not isinstance(back, dict) or "model" not in back:
            raise DamagedCheckpointError(f"{path.name} was written but reads back wrong; the previous "
                                         f"{path.name} is kept.")
        del back
    atomic_write_json(path.with_suffix(".json"), sidecar.to_dict())
    return path


def _tensor_bytes(value: Any) -> int:
    """The bytes of every tensor in a (nested) record: what torch.save will write, give or take the pickle."""
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.element_size() * value.numel())
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _read_back(path: Path) -> Any:
    """The file as torch reads it: memory-mapped (its structure, not every byte), else in full."""
    import torch
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception:  # noqa: BLE001 — a file system without mmap; a damaged file fails again below
        return torch.load(path, map_location="cpu", weights_only=False)


def _instead(path: Path) -> str:
    """What to use instead of the damaged checkpoint at `path`: the other checkpoints of its project, newest
    first (last, best and the kept steps)."""
    folder = path.parent.parent if path.parent.name == _HISTORY else path.parent
    found = [*folder.glob("*.pt"), *(folder / _HISTORY).glob("step*.pt")]
    others = sorted((p for p in found if p != path and p.is_file() and p.stat().st_size > 0),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    if not others:
        return f"delete it and train again (`gguf-trainer reset --project {folder.parent} train`)."
    return (f"an earlier one can be used ({', '.join(p.stem for p in others)}): `gguf-trainer snapshot --project "
            f"{folder.parent} --checkpoint {others[0].stem}` exports {others[0].stem}.")


def load(project_or_path: "ProjectFolder | Path", which: str = BEST, map_location: Any = "cpu",
         mmap: bool = False) -> dict[str, Any]:
    """A checkpoint's record; refuses a missing, damaged or other-format file with one sentence.
    `mmap`: the tensors map the file copy-on-write instead of being read into memory (export and
    eval only read them; a rename over the file later leaves the mapping on the old one)."""
    import torch
    path = project_or_path if isinstance(project_or_path, Path) else weights_path(project_or_path, which)
    try:
        record = torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist: the train stage has not saved it yet.") from None
    except Exception as e:
        raise DamagedCheckpointError(f"The checkpoint {path} is damaged (cut short or overwritten: it does not read "
                                     f"as a checkpoint); {_instead(path)}") from e
    if not isinstance(record, dict) or "model" not in record:
        raise DamagedCheckpointError(f"{path} is not a gguf-trainer checkpoint; remove it and train again.")
    found = record.get("format", FORMAT)     # kept steps of earlier versions carry no format: they are 1
    if found != FORMAT:
        raise CheckpointError(f"{path} is a checkpoint of format {found}, and this version reads format "
                              f"{FORMAT}; use the gguf-trainer version that wrote it, or reset training.")
    if "steps" in record and "planned_steps" not in record:     # kept steps of earlier versions
        record["planned_steps"] = record.pop("steps")
    return record


def load_resumable(project: "ProjectFolder", needs: tuple[str, ...], map_location: Any = "cpu"
                   ) -> tuple[str | None, dict[str, Any] | None, list[str]]:
    """The newest checkpoint a run can resume from: `last`, else `best` (a file that cannot be read,
    or lacks one of the keys in `needs`, is skipped). Returns (name, record, one sentence per file
    skipped); (None, None, skipped) when none is left. A checkpoint of another format still raises."""
    skipped: list[str] = []
    for which in (LAST, BEST):
        if not exists(project, which):
            continue
        try:
            record = load(project, which, map_location=map_location)
        except DamagedCheckpointError as e:
            skipped.append(str(e))
            continue
        missing = [k for k in needs if k not in record]
        if missing:
            skipped.append(f"{weights_path(project, which)} lacks {', '.join(missing)}; it may be damaged.")
            continue
        return which, record, skipped
    return None, None, skipped


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


# ---------------------------------------------------------------- kept steps

def save_kept_step(project: "ProjectFolder", record: dict[str, Any], sidecar: Sidecar) -> Path:
    """A weights-only copy at `sidecar.trained_steps` (train.history)."""
    return save(project, f"step{sidecar.trained_steps}", record, sidecar)


def kept_steps(project: "ProjectFolder") -> list[dict[str, Any]]:
    """Kept steps, newest first: their sidecars plus `id`, `size` and `path`."""
    folder = project.checkpoints_dir / _HISTORY
    rows = []
    for path in folder.glob("step*.pt") if folder.is_dir() else []:
        if not path.stem[4:].isdigit():
            continue
        info = Sidecar.from_dict(read_json(path.with_suffix(".json"), None))
        if info is None:
            continue
        rows.append({**info.to_dict(), "id": path.stem, "size": path.stat().st_size, "path": str(path)})
    return sorted(rows, key=lambda r: -r["step"])


def prune_kept_steps(project: "ProjectFolder", keep: int) -> list[int]:
    """Delete all but the newest `keep` kept steps (0 keeps all); returns the steps deleted."""
    if not keep:
        return []
    gone = [row["step"] for row in kept_steps(project)[keep:]]
    for step in gone:
        delete_kept_step(project, f"step{step}")
    return gone


def delete_kept_step(project: "ProjectFolder", which: str) -> None:
    """Delete a kept step (weights and sidecar); GGUFs exported from it stay."""
    if not which.startswith("step"):
        raise CheckpointError(f"There is no kept step {which}.")
    path = weights_path(project, which)
    if not path.is_file():
        raise CheckpointError(f"There is no kept step {which}.")
    path.unlink()
    path.with_suffix(".json").unlink(missing_ok=True)


# ---------------------------------------------------------------- the folder

def series_path(project: "ProjectFolder", name: str = "metrics") -> Path:
    """The train stage's metric series: `metrics` (one point per log interval) or `val`."""
    return project.checkpoints_dir / f"{name}.jsonl"


def remove_temps(project: "ProjectFolder") -> list[Path]:
    """Delete the temp files of checkpoint writes a kill interrupted (`.<name>.*.tmp` in checkpoints/
    and checkpoints/history/). Only the train stage writes there, and the run lock allows one."""
    from trainer_core.base.atomic import remove_temps_in
    return remove_temps_in([project.checkpoints_dir, project.checkpoints_dir / _HISTORY])


def move_aside(folder: Path) -> Path | None:
    """Rename a non-empty folder to `<name>.stale-<time>[-n]` beside it; None when there is nothing."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    stamp = time.strftime('%Y%m%d-%H%M%S')
    target, n = folder.with_name(f"{folder.name}.stale-{stamp}"), 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}.stale-{stamp}-{n}")
    folder.rename(target)
    return target


def archive(project: "ProjectFolder") -> Path | None:
    """Move checkpoints/ aside to checkpoints.stale-<time> (its shards were discarded)."""
    return move_aside(project.checkpoints_dir)


# ---------------------------------------------------------------- the start

def start_path(project: "ProjectFolder") -> Path:
    """The adapter GGUF the train stage starts from when there is no checkpoint (a copy of the user's)."""
    return project.root / _START / "adapter.gguf"


def start_record_path(project: "ProjectFolder") -> Path:
    """Where the start came from (a file or a Hub repo), its digest and its config."""
    return project.root / _START / "from.json"


def read_start_record(project: "ProjectFolder") -> dict[str, Any] | None:
    """The start's record when the project has a start file, else None."""
    if not start_path(project).is_file():
        return None
    record = read_json(start_record_path(project), None)
    return record if isinstance(record, dict) else {"source": str(start_path(project))}
