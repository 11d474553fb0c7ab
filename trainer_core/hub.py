"""The Hugging Face Hub as materials.py asks it: its address, whether it answers at all, and a repo's file listing.

The address is `HF_ENDPOINT` read at call time. `hub_unreachable` asks once, without retries: huggingface_hub's
listing retries a dead connection five times with back-off (~23 s, a warning line per try), which an open of a
project must not pay, per material, each time it is offline.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer_core.base.errors import first_line

if TYPE_CHECKING:
    from trainer_core.packs.base import Material

__all__ = ["HubFile", "endpoint", "selected", "hub_unreachable", "list_files", "OFFLINE_MODE"]

OFFLINE_MODE = "HF_HUB_OFFLINE is set"          # hub_unreachable's answer in offline mode (not a failure to report)


@dataclass(frozen=True)
class HubFile:
    path: str          # inside the repo
    size: int
    sha256: str | None  # LFS files
    blob_id: str        # git blob sha1 (small files are checked against it)


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


def selected(path: str, patterns: tuple[str, ...]) -> bool:
    # fnmatch's * also crosses "/", as the Hub's allow-patterns do
    return not patterns or any(fnmatch.fnmatch(path, p) for p in patterns)


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hub cannot be asked now (offline mode, no connection), from one request without retries; None
    when it answers at all (any HTTP status)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session
    if constants.HF_HUB_OFFLINE:
        return OFFLINE_MODE
    try:
        get_session().head(endpoint(), timeout=timeout)
    except Exception as e:     # noqa: BLE001 — no route, refused, no name, a proxy or TLS failure: not reachable
        return first_line(e)
    return None


def list_files(material: "Material", token: str | None = None, timeout: float = 10.0) -> list[HubFile]:
    """The repo's files that the material's allow-patterns select (raises when the Hub cannot be
    reached or refuses)."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile
    api = HfApi(endpoint=endpoint(), token=token)
    entries = api.list_repo_tree(material.repo, recursive=True, repo_type=material.repo_type, token=token)
    out = []
    for entry in entries:
        if isinstance(entry, RepoFile) and selected(entry.path, material.patterns):
            out.append(HubFile(entry.path, int(entry.size), entry.lfs.sha256 if entry.lfs else None, entry.blob_id))
    return sorted(out, key=lambda f: f.path)
