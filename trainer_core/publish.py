"""Publish an export to the Hugging Face Hub: `gguf-trainer publish` and the Output tab's Publish panel.

    gguf-trainer publish --project DIR --repo OWNER/NAME [--private] [--include-snapshots] [--allow-demo]

What goes up (`planned_files`, the panel's confirm list): the final GGUF, the model card as the repo's README.md
(stages/model_card.py, written if the export predates it), its plot, the files the pack exports beside the adapter
and, with --include-snapshots, the step-tagged snapshots. Never the token, the corpus, the project folder or a
path of this machine (the card names files by their names only). A mock-teacher or demo export needs
--allow-demo: its adapter is no use to anyone.

It creates the repo if needed (private when asked) and sends everything with huggingface_hub in one commit
(`create_commit`): large files the way the library sends them (Xet where hf_xet is installed, else the LFS
preupload → batch → upload → commit path), whose own check skips the large files the Hub already holds, so a
publish that a dropped connection ended completes when run again. The commit message names the step. Every
refusal is one sentence (PublishError, exit 2): no token, no write access, a bad repo name, the Hub unreachable,
a refusal with its message (a quota). A publish writes nothing in the export folder (but the card of an export
made before cards existed, once).
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainer_core.base import token_store
from trainer_core.base.errors import first_line, TrainerError, UsageError
from trainer_core.contract.shards import mock_enabled, read_contract
from trainer_core.hub import OFFLINE_MODE, endpoint, hub_unreachable
from trainer_core.project import Project

__all__ = ["PublishError", "Upload", "planned_files", "check_repo_name", "publish", "add_parser", "cmd_publish",
           "default_repo"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class PublishError(UsageError):
    """A publish the user can fix: no token, no write access, a bad repo name, offline, a refusal (exit 2)."""


@dataclass(frozen=True)
class Upload:
    local: Path         # the file on disk
    in_repo: str        # its path in the repo
    size: int


def default_repo(project: Project) -> str:
    """The repo name the panel proposes: the adapter's name (created under the token's account)."""
    return project.settings.name


def check_repo_name(repo: str) -> str:
    """`OWNER/NAME` or `NAME` (under the token's account), as the Hub accepts them; else one sentence."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id
    repo = (repo or "").strip()
    parts = repo.split("/")
    try:
        validate_repo_id(repo)                       # the library's own rules, then ours (a name per part)
    except HFValidationError:
        parts = []
    if not parts or len(parts) > 2 or not all(_NAME.match(p) and ".." not in p and "--" not in p
                                              and not p.endswith((".", "-")) for p in parts):
        raise PublishError(f'"{repo}" is not a Hub repo name: use OWNER/NAME (letters, digits, ".", "-" and "_", '
                           f'at most 96 characters each), such as yourname/{_example(repo)}.')
    return repo


def _example(repo: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", repo.split("/")[-1]).strip("-.") or "my-adapter"


def is_machinery_check(project: Project) -> bool:
    """A demo project or a run on the mock teacher: its adapter says nothing about quality."""
    return project.is_demo or mock_enabled(project) or (read_contract(project, "val") or "").endswith(" mock-teacher")


def planned_files(project: Project, include_snapshots: bool = False) -> list[Upload]:
    """Exactly the files a publish sends, in order (the panel lists them before it sends)."""
    gguf = project.gguf_path()
    if not gguf.is_file():
        raise PublishError(f"There is no export to publish: {gguf.name} is not in the output folder; run the "
                           f"export stage first (`gguf-trainer run --project {project.root} --only export eval`).")
    card, plot = project.card_path(), project.card_plot_path()
    files = [Upload(gguf, gguf.name, gguf.stat().st_size)]
    if card.is_file():
        files.append(Upload(card, "README.md", card.stat().st_size))
    if plot.is_file():
        files.append(Upload(plot, plot.name, plot.stat().st_size))
    files += [Upload(p, p.name, p.stat().st_size) for p in project.pack.extras.outputs(project)]
    if include_snapshots:
        out, name = project.output_dir(), project.settings.name
        files += [Upload(p, p.name, p.stat().st_size) for p in sorted(out.glob(f"{name}-step*-f16.gguf"))]
    return files


def _step(project: Project) -> int | None:
    from trainer_core.contract.gguf_io import KV_TRAINED_STEPS
    from trainer_core.contract.gguf_read import read_gguf_kvs
    try:
        return int(read_gguf_kvs(project.gguf_path())[KV_TRAINED_STEPS])
    except (TrainerError, KeyError, ValueError, TypeError):
        return None


def _hub_error(e: BaseException, repo: str) -> TrainerError:
    """One sentence for what the Hub or the connection answered."""
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError
    seen: BaseException | None = e
    while seen is not None and not isinstance(seen, (HfHubHTTPError, HFValidationError)):
        seen = seen.__cause__ or seen.__context__
    if isinstance(seen, HFValidationError):
        return PublishError(f'"{repo}" is not a Hub repo name: use OWNER/NAME ({seen}).')
    if isinstance(seen, HfHubHTTPError) and seen.response is not None:
        code = seen.response.status_code
        said = (seen.server_message or "").strip().rstrip(".") or "no reason given"
        if code == 401:
            return PublishError("The Hub does not accept the token (HTTP 401); set a valid token with write access in "
                                "Setup (Hugging Face token) or with `hf auth login`, then publish again.")
        if code == 403:
            return PublishError(f"The token may not write to {repo} (HTTP 403: {said}); use a token with write access "
                                f"to that namespace, or a repo under your own name.")
        if 400 <= code < 500:
            return PublishError(f"The Hub refused the upload to {repo} (HTTP {code}: {said}); nothing was published.")
        return TrainerError(f"The Hub failed (HTTP {code}: {said}); nothing was published, try again later.")
    text = first_line(e).rstrip(".:")
    if _lost_connection(e):
        return PublishError(f"The connection to the Hub was lost while publishing to {repo} ({text}); publish again "
                            f"when it is back (what the Hub already holds is not sent twice).")
    return TrainerError(f"Publishing to {repo} failed ({type(e).__name__}: {text}); nothing was published.")


def _lost_connection(e: BaseException) -> bool:
    """A transport error anywhere in the chain (httpx's TransportError family, a socket's OSError)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) or any(c.__name__ == "TransportError" for c in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def publish(project: Project, repo: str, private: bool = True, include_snapshots: bool = False,
            allow_demo: bool = False, say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Create the repo if needed and send `planned_files` in one commit; {"repo", "url", "commit", "files"}."""
    repo = check_repo_name(repo)
    if is_machinery_check(project) and not allow_demo:
        raise PublishError("This export is a machinery check (a demo project or the mock teacher's synthetic "
                           "targets), no usable adapter; publish it anyway with --allow-demo (the Publish panel's "
                           "\"publish a machinery check\" box).")
    if not project.card_path().is_file():            # an export made before cards: its card, once
        from trainer_core.stages.model_card import write_card
        write_card(project)
    files = planned_files(project, include_snapshots)
    token = token_store.resolve(project.settings.hf_token)
    if not token:
        raise PublishError("There is no Hugging Face token: set one with write access in Setup (Hugging Face token) "
                           "or with `hf auth login`, then publish again.")
    why = hub_unreachable()
    if why == OFFLINE_MODE:
        raise PublishError("HF_HUB_OFFLINE is set, so nothing goes to the Hub; unset it and publish again.")
    if why is not None:
        raise PublishError(f"The Hub cannot be reached ({why}); connect and publish again — nothing was sent.")
    from huggingface_hub import CommitOperationAdd, HfApi
    api = HfApi(endpoint=endpoint(), token=token)
    step = _step(project)
    try:
        say(f"creating {repo} if needed ({'private' if private else 'public'})")
        url = api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        repo_id = url.repo_id or repo
        total = sum(f.size for f in files)
        for f in files:
            say(f"  {f.in_repo}  {f.size / 1e6:.2f} MB")
        say(f"sending {len(files)} files ({total / 1e6:.1f} MB) to {repo_id} in one commit")
        operations = [CommitOperationAdd(path_in_repo=f.in_repo, path_or_fileobj=str(f.local)) for f in files]
        message = f"{project.gguf_path().name}: export of step {step}" if step is not None else \
            f"{project.gguf_path().name}: export"
        commit = api.create_commit(repo_id, operations, commit_message=message, repo_type="model")
    except TrainerError:
        raise
    except Exception as e:       # noqa: BLE001 — the Hub's or the connection's answer, as one sentence
        raise _hub_error(e, repo) from None
    say(f"published: {commit.commit_url}")
    return {"repo": repo_id, "url": str(url), "commit": commit.oid, "message": message,
            "files": [{"path": f.in_repo, "size": f.size} for f in files]}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("publish", help="upload the export, its model card and plot to the Hugging Face Hub")
    p.add_argument("--project", required=True, metavar="DIR", help="the project folder (made by `new` or `demo`)")
    p.add_argument("--repo", required=True, metavar="OWNER/NAME", help="the model repo (created if needed)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--include-snapshots", action="store_true", help="also the step-tagged snapshot GGUFs")
    p.add_argument("--allow-demo", action="store_true", help="publish a demo or mock-teacher export anyway")


def cmd_publish(args: argparse.Namespace) -> int:
    import sys
    project = Project.open(args.project)
    result = publish(project, args.repo, args.private, args.include_snapshots, args.allow_demo,
                     say=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"{result['repo']} {result['commit']} {result['message']}")
    return 0
