"""The Hugging Face token: a project's own in `<project>/.hf_token`, else the Hugging Face token store.

A token is a secret, not a setting: it never goes in project.json, which people copy, attach to bug
reports and share. A project's own token lives in `.hf_token`, created with mode 0600: the bytes go
to a temp file that `mkstemp` opens 0600, are fsynced, and the temp file is renamed over the old one,
so the token is never readable by another user, not even for a moment. A project without one uses
the token the Hugging Face tools already use (`HF_TOKEN`, then the file `hf auth login` writes under
`HF_HOME`), found by `huggingface_hub.get_token()`.

Nothing here prints a token: `describe` says where it comes from, never what it is.
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["TOKEN_FILE", "read_token", "write_token", "hub_token", "resolve", "describe"]

TOKEN_FILE = ".hf_token"


def _path(folder: str | os.PathLike) -> Path:
    return Path(folder) / TOKEN_FILE


def read_token(folder: str | os.PathLike) -> str:
    """The folder's own token, "" when it has none. A file another user could read (copied in with
    other permissions) is narrowed to 0600 first, where its owner may."""
    path = _path(folder)
    try:
        mode = path.stat().st_mode
        if stat.S_IMODE(mode) & 0o077:
            try:
                os.chmod(path, 0o600)
            except OSError:           # not ours, or a read-only folder: still the user's token to use
                pass
        return path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""


def write_token(folder: str | os.PathLike, token: str) -> None:
    """Store `token` as the folder's own (mode 0600 from creation on); an empty one removes the file.
    Writes nothing when the file already holds that token."""
    path, token = _path(folder), token.strip()
    if token == read_token(folder):
        return
    if not token:
        path.unlink(missing_ok=True)
        return
    try:
        _write(path, token)
    except OSError as e:                      # a read-only or full disk: one sentence
        from trainer_core.base.diskspace import disk_error
        raise (disk_error(e, path) or e) from None


def _write(path: Path, token: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f"{TOKEN_FILE}.", suffix=".tmp", dir=path.parent)   # O_EXCL, 0600
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if os.name == "posix":
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def hub_token() -> str | None:
    """The token of the Hugging Face token store (`HF_TOKEN`, then `hf auth login`'s file), or None."""
    try:
        from huggingface_hub import get_token
        return get_token() or None
    except Exception:   # noqa: BLE001 — a broken login (an OIDC exchange that fails) is no login: the Hub says 401
        return None


def resolve(own: str | None) -> str | None:
    """The token to send: the project's own (`own`), else the Hugging Face token store's."""
    return own or hub_token()


def describe(own: str | None) -> str:
    """Where the token comes from, for status and logs; never the token."""
    if own:
        return f"set in the project ({TOKEN_FILE}, readable only by you)"
    return "not set in the project: the Hugging Face login's token is used, if any (HF_TOKEN or `hf auth login`)"
