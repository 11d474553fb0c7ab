"""The error hierarchy. Every message a user sees is one sentence that says what
happened and what to do; the CLI prints it and exits with the error's code, the GUI
shows it in its error banner.

    TrainerError                 base; exit code 1
    ├── UsageError               bad input from the user; exit code 2
    │   ├── ConfigError          one or more invalid settings (all of them listed)
    │   ├── NoProjectError       the folder is not a project
    │   ├── ProjectExistsError   `new` on a folder that already is a project
    │   ├── UnknownPackError     no pack with that id
    │   ├── ModelFileError       a GGUF / model / dump file we cannot use as it is
    │   ├── FolderError          a folder we cannot write: read-only, no permission, a file in
    │   │                        the way (base/diskspace.py)
    │   ├── CheckpointNameError  a checkpoint name that is none of last, best, step<N>
    │   │                        (contract/checkpoints.py; also a CheckpointError)
    │   ├── CorpusError          a prompt file that is missing, cannot be read or is too small
    │   ├── DamagedCheckpointError  a checkpoint that cannot be read (contract/checkpoints.py; also a
    │   │                        CheckpointError)
    │   └── NoCheckpointError    a checkpoint asked for that is not there (contract/checkpoints.py; also
    │                            a CheckpointError)
    ├── AlreadyRunningError      the project's run lock is held; exit code 3
    ├── DiskFullError            a write that does not fit on its disk (base/diskspace.py)
    ├── StageNotAvailableError   a stage this version does not implement yet
    ├── CheckpointError          a checkpoint that is missing, damaged or of another format
    ├── RopeError                a teacher's rotary tables stay broken after the repair
    │                            (packs/rope_guard.py; also a RuntimeError)
    └── DownloadError            a material download the Hub refused, that failed its check
                                 or that does not fit on the disk (materials.py)

The subclasses that live beside the code raising them are listed here so that the tree stays
whole: every exception a user can see derives from TrainerError, which is what the CLI and the
GUI catch. They keep the base exit code 1 (a failure, not bad input).
"""
from __future__ import annotations

__all__ = [
    "first_line",
    "TrainerError", "UsageError", "ConfigError", "NoProjectError", "ProjectExistsError",
    "UnknownPackError", "ModelFileError", "AlreadyRunningError", "CorpusError", "StageNotAvailableError",
    "DiskFullError", "FolderError",
]


class TrainerError(Exception):
    """Base class: the message is meant for the user as it is."""

    exit_code = 1


class UsageError(TrainerError):
    exit_code = 2


class ConfigError(UsageError):
    """Every problem of a configuration at once; `problems` keeps them one per item."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f"{len(self.problems)} settings are invalid: " + "; ".join(self.problems)
        super().__init__(text)


class NoProjectError(UsageError):
    pass


class ProjectExistsError(UsageError):
    pass


class UnknownPackError(UsageError):
    pass


class ModelFileError(UsageError):
    pass


class AlreadyRunningError(TrainerError):
    exit_code = 3

    def __init__(self, message: str, pid: int | None = None):
        super().__init__(message)
        self.pid = pid


class CorpusError(UsageError):
    pass


class DiskFullError(TrainerError):
    pass


class FolderError(UsageError):
    pass


class StageNotAvailableError(TrainerError):
    pass


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a one-sentence error
    quotes of a library's multi-line one."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
