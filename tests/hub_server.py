"""A local stand-in for the Hugging Face Hub on loopback, for download and upload tests.

It speaks the subset of the Hub HTTP API that huggingface_hub 2.4 and datasets 5.2 call
(checked against their sources and observed in `LocalHub.requests`):

    GET  /api/{models|datasets}/{repo}[/revision/{rev}]         repo info with siblings
    GET  /api/{models|datasets}/{repo}/tree/{rev}[/{path}]      ?recursive=&expand=
    POST /api/{models|datasets}/{repo}/paths-info/{rev}         form or JSON "paths"
    HEAD|GET /[datasets/]{repo}/resolve/{rev}/{path}            Range: bytes=a-, a-b, -n
    GET  /api/{models|datasets}?search=&limit=&expand=&full=    the repo search (HfApi.list_models), paged
                                                                 by a Link header (see "Search" at the end)

Uploads (the section "uploads" below; huggingface_hub 2.5's create_repo, create_commit and its plain LFS path,
checked against hf_api.py, _commit_api.py and lfs.py):

    POST /api/repos/create                                      JSON {name, organization, visibility, type}
    POST /api/validate-yaml                                     JSON {content, repoType}: the README's metadata
    POST /api/{models|datasets}/{repo}/preupload/{rev}          uploadMode lfs (a binary sample, or 10 MB) / regular
    POST /[datasets/]{repo}.git/info/lfs/objects/batch          "basic" transfer; no actions for a stored object
    PUT  /lfs-objects/{oid}   POST /lfs-objects/verify          the upload and verify actions' hrefs
    POST /api/{models|datasets}/{repo}/commit/{rev}             NDJSON: header, file (base64), lfsFile, deletedFile

The library chooses Xet on its own side whenever hf_xet is installed (utils/_runtime.is_xet_available: no
server negotiation), so an upload test sets HF_HUB_DISABLE_XET (the constant in-process, the variable in a child).

Files are served straight from `/resolve` with a 200/206 (no redirect to a CDN, no X-Xet-*
headers), so clients take their plain-HTTP path. The dataset viewer
(`http://datasets-server.<host>/...`, which datasets derives from HF_ENDPOINT) and any
HTTPS tunnel are answered here too when a client uses `client_env()`, whose proxy settings
route every non-loopback request to this server: nothing leaves the machine, and a stray
request shows up in `requests` instead of on the network.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

__all__ = ["LocalHub", "RecordedRequest", "parquet_bytes", "go_online"]

CHUNK_BYTES = 16 * 1024
LFS_POINTER_SIZE = 134  # what the Hub reports for every LFS pointer file
LFS_UPLOAD_SIZE = 10 * 1024 * 1024  # preupload: a text file this large goes to LFS too
LAST_MODIFIED = "2024-01-01T00:00:00.000Z"
_REPO_TYPES = {"models": "model", "datasets": "dataset"}
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class RecordedRequest(NamedTuple):
    """One request the server received; `headers` has lower-cased keys."""

    method: str
    path: str  # path with query, or the absolute URL of a proxied request
    headers: dict[str, str]


@dataclass(frozen=True)
class _File:
    path: str
    data: bytes
    blob_oid: str  # git blob sha1, the Hub's "oid" for every file
    sha256: str | None  # set only when the file counts as LFS


@dataclass(frozen=True)
class _Repo:
    repo_id: str
    repo_type: str
    sha: str
    files: dict[str, _File]

    def directories(self) -> set[str]:
        return {"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)}


class _HubError(Exception):
    """An error response: status, X-Error-Code and an optional X-Repo-Commit."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.commit = status, code, commit


def parquet_bytes(rows: list[dict]) -> bytes:
    """The bytes of a parquet file holding `rows` (one dict per row)."""
    import pyarrow as pa  # only the dataset tests need pyarrow
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def _metadata_errors(readme: str) -> list[str]:
    """What the Hub's validate-yaml would refuse in a README: front matter that is no YAML mapping, or a
    model-index huggingface_hub itself cannot read."""
    import yaml
    from huggingface_hub.repocard_data import model_index_to_eval_results
    if not readme.startswith("---\n"):
        return []
    try:
        data = yaml.safe_load(readme[4:].split("\n---", 1)[0])
    except yaml.YAMLError as e:
        return [f"YAML: {e}"]
    if not isinstance(data, dict):
        return ["the metadata is not a mapping"]
    try:
        if "model-index" in data:
            model_index_to_eval_results(data["model-index"])
    except (KeyError, TypeError, ValueError) as e:
        return [f"model-index: {e!r}"]
    return []


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _build_repo(repo_id: str, repo_type: str, files: dict[str, bytes], lfs_threshold: int) -> _Repo:
    built = {
        path: _File(path, data, _git_blob_sha1(data),
                    hashlib.sha256(data).hexdigest() if len(data) >= lfs_threshold else None)
        for path, data in files.items()
    }
    # From the id alone, so a test can hard-code or recompute it.
    return _Repo(repo_id, repo_type, hashlib.sha1(repo_id.encode()).hexdigest(), built)


class LocalHub:
    """A Hub on http://127.0.0.1:PORT serving in-memory repos; use it as a context manager.

    repos: {repo_id: {path_in_repo: bytes}}; repo_types: {repo_id: "model" | "dataset"}
    (default "model"); a file of lfs_threshold bytes or more counts as LFS.

    Test knobs (set them any time, keyed by (repo_id, path_in_repo)):
      fake_sizes[key] = n   report size n in info, tree, paths-info and HEAD; GET still
                            sends the real bytes.
      stall_after[key] = k  every GET of that file sends k bytes from the requested offset,
                            sets `stalled`, then hangs until release() (it then sends the
                            rest) or stop() (it drops the connection).
      delay_s               pause after each 16 KiB chunk of a file body.
    """

    def __init__(self, repos: dict[str, dict[str, bytes]], repo_types: dict[str, str] | None = None,
                 *, lfs_threshold: int = 1024):
        repo_types = repo_types or {}
        self.lfs_threshold = lfs_threshold
        self._repos = {
            (repo_types.get(repo_id, "model"), repo_id):
                _build_repo(repo_id, repo_types.get(repo_id, "model"), files, lfs_threshold)
            for repo_id, files in repos.items()
        }
        self.fake_sizes: dict[tuple[str, str], int] = {}
        self.stall_after: dict[tuple[str, str], int] = {}
        self.delay_s: float = 0.0
        self.stalled = threading.Event()
        self._init_uploads()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._release = threading.Condition(self._lock)
        self._release_generation = 0
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True  # a stalled handler must never keep the process alive
        self._server.hub = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> LocalHub:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="LocalHub",
                                            kwargs={"poll_interval": 0.05}, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, drop stalled and idle keep-alive connections; safe to call twice."""
        with self._release:
            if self._stopping.is_set():
                return
            self._stopping.set()
            self._release.notify_all()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes handlers blocked reading the next request
            except OSError:
                pass
        self._server.server_close()

    # -- what tests look at ------------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def release(self) -> None:
        """Let every currently stalled GET send the rest of its body."""
        with self._release:
            self._release_generation += 1
            self._release.notify_all()

    def commit_sha(self, repo_id: str) -> str:
        return next(r.sha for (_, rid), r in self._repos.items() if rid == repo_id)

    def client_env(self, home: str | os.PathLike[str]) -> dict[str, str]:
        """os.environ for a child process that uses this Hub online, with caches under `home`.

        Proxies send every non-loopback request (datasets' dataset-viewer probe, any https
        call) to this server, which answers it with 404 / 403 and records it.
        """
        home = Path(home)
        env = {k: v for k, v in os.environ.items()
               if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env[var] = env[var.lower()] = self.url
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env.update(HF_ENDPOINT=self.url, HF_HOME=str(home / "hf"), HF_HUB_CACHE=str(home / "hf" / "hub"),
                   HF_DATASETS_CACHE=str(home / "datasets"), HF_HUB_DISABLE_TELEMETRY="1",
                   HF_HUB_DISABLE_PROGRESS_BARS="1",
                   # datasets otherwise HEADs https://s3.amazonaws.com/... to count each load
                   HF_UPDATE_DOWNLOAD_COUNTS="0")
        return env

    # -- used by the handler -----------------------------------------------------------------
    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            (self._connections.add if open_ else self._connections.discard)(conn)

    def _wait_for_release(self) -> bool:
        """Hang a stalled GET; True when released, False when the server stops."""
        with self._release:
            generation = self._release_generation
            self.stalled.set()
            self._release.wait_for(lambda: self._release_generation != generation or self._stopping.is_set())
            return not self._stopping.is_set()

    def _reported_size(self, repo: _Repo, f: _File) -> int:
        return self.fake_sizes.get((repo.repo_id, f.path), len(f.data))

    def _find_repo(self, repo_type: str, segments: list[str]) -> tuple[_Repo, list[str]]:
        """Split URL segments into a known repo ("ns/name" or "name") and the rest."""
        for n in (2, 1):
            repo = self._repos.get((repo_type, "/".join(segments[:n])))
            if repo is not None and len(segments) >= n:
                return repo, segments[n:]
        raise _HubError(404, "RepoNotFound", "Repository not found")

    @staticmethod
    def _check_revision(repo: _Repo, revision: str) -> None:
        if revision not in ("main", repo.sha):
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    # -- JSON bodies -------------------------------------------------------------------------
    def _info(self, repo: _Repo) -> dict[str, Any]:
        siblings = []
        for f in sorted(repo.files.values(), key=lambda f: f.path):
            sibling: dict[str, Any] = {"rfilename": f.path, "size": self._reported_size(repo, f),
                                       "blobId": f.blob_oid}
            if f.sha256:  # siblings spell the LFS hash "sha256", tree entries spell it "oid"
                sibling["lfs"] = {"sha256": f.sha256, "size": self._reported_size(repo, f),
                                  "pointerSize": LFS_POINTER_SIZE}
            siblings.append(sibling)
        info: dict[str, Any] = {"_id": repo.sha[:24], "id": repo.repo_id, "author": repo.repo_id.split("/")[0],
                                "sha": repo.sha, "lastModified": LAST_MODIFIED, "createdAt": LAST_MODIFIED,
                                "private": False, "disabled": False, "gated": False, "downloads": 0,
                                "likes": 0, "tags": [], "siblings": siblings}
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
        return info

    def _entry(self, repo: _Repo, path: str, expand: bool) -> dict[str, Any]:
        f = repo.files.get(path)
        if f is None:
            entry: dict[str, Any] = {"type": "directory", "size": 0, "path": path,
                                     "oid": hashlib.sha1(f"tree {repo.sha} {path}".encode()).hexdigest()}
        else:
            entry = {"type": "file", "oid": f.blob_oid, "size": self._reported_size(repo, f), "path": path}
            if f.sha256:
                entry["lfs"] = {"oid": f.sha256, "size": self._reported_size(repo, f),
                                "pointerSize": LFS_POINTER_SIZE}
        if expand:
            entry["lastCommit"] = {"id": repo.sha, "title": "LocalHub commit", "date": LAST_MODIFIED}
        return entry

    def _tree(self, repo: _Repo, prefix: str, recursive: bool, expand: bool) -> list[dict[str, Any]]:
        if prefix and prefix not in repo.directories():
            raise _HubError(404, "EntryNotFound", f"{prefix} does not exist on main", repo.sha)
        base = f"{prefix}/" if prefix else ""
        paths = [p for p in (*repo.directories(), *repo.files) if p.startswith(base)]
        if not recursive:
            paths = [p for p in paths if "/" not in p[len(base):]]
        return [self._entry(repo, p, expand) for p in sorted(paths)]

    def _paths_info(self, repo: _Repo, paths: list[str], expand: bool) -> list[dict[str, Any]]:
        known = repo.directories() | set(repo.files)
        return [self._entry(repo, p.strip("/"), expand) for p in paths if p.strip("/") in known]

    # -- uploads (create_repo, preupload, LFS batch + basic upload, commit) ---------------------------------
    def _init_uploads(self) -> None:
        """Upload knobs (set them any time):
          write_tokens       None: any Bearer token may write; else only these (others: 403, none: 401).
          refuse[endpoint] = (status, message)  answer that endpoint ("create", "preupload", "batch", "upload",
                             "commit") with this error and X-Error-Message, as the Hub does (a quota, a ban).
          drop_uploads       the next n LFS PUTs read half their body, then the connection is closed unanswered.
          drop_commits       the next n commits are read, then the connection is closed unanswered (not committed).
          owner              the namespace of a repo created without one (the token's user on the Hub).
        What tests read: `lfs_objects` {sha256: bytes} stored, `lfs_puts` [(sha256, complete)] every PUT,
        `commits` {repo_id: [{"oid", "summary", "paths", "private"}]}, `repo_files(repo_id)`."""
        self.write_tokens: set[str] | None = None
        self.refuse: dict[str, tuple[int, str]] = {}
        self.drop_uploads = 0
        self.drop_commits = 0
        self.owner = "local-user"
        self.lfs_objects: dict[str, bytes] = {}
        self.lfs_puts: list[tuple[str, bool]] = []
        self.commits: dict[str, list[dict[str, Any]]] = {}
        self._private: dict[str, bool] = {}

    def repo_files(self, repo_id: str) -> dict[str, bytes]:
        """{path: bytes} of the repo's head commit."""
        with self._lock:
            repo = next(r for (_, rid), r in self._repos.items() if rid == repo_id)
            return {path: f.data for path, f in repo.files.items()}

    def _authorize(self, endpoint: str, headers: dict[str, str]) -> None:
        token = headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not token:
            raise _HubError(401, None, "Invalid username or password.")
        if self.write_tokens is not None and token not in self.write_tokens:
            raise _HubError(403, None, "You don't have the rights to create a model under this namespace")
        if endpoint in self.refuse:
            status, message = self.refuse[endpoint]
            raise _HubError(status, "Refused", message)

    def _create_repo(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or self.owner}/{payload['name']}"
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self.url}/{prefix}{repo_id}"
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                return 409, {"error": "You already created this model repo", "url": url}
            self._repos[(repo_type, repo_id)] = _Repo(repo_id, repo_type, hashlib.sha1(repo_id.encode()).hexdigest(), {})
            self._private[repo_id] = payload.get("visibility") == "private"
        return 200, {"url": url, "name": repo_id}

    def _commit(self, repo: _Repo, lines: list[dict[str, Any]]) -> dict[str, Any]:
        """Apply an NDJSON commit: a new head with the files changed; an lfsFile must be stored already."""
        header = next((line["value"] for line in lines if line.get("key") == "header"), {})
        files = dict(repo.files)
        for line in lines:
            key, value = line.get("key"), line.get("value") or {}
            if key == "file":
                data = base64.b64decode(value["content"])
                files[value["path"]] = _File(value["path"], data, _git_blob_sha1(data), None)
            elif key == "lfsFile":
                data = self.lfs_objects.get(value["oid"])
                if data is None or len(data) != value["size"]:
                    raise _HubError(422, "LfsObjectMissing", f"LFS object {value['oid']} was not uploaded")
                files[value["path"]] = _File(value["path"], data, _git_blob_sha1(data), value["oid"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
        paths = [line["value"]["path"] for line in lines if line.get("key") in ("file", "lfsFile", "deletedFile")]
        oid = hashlib.sha1(json.dumps([repo.sha, lines], sort_keys=True).encode()).hexdigest()
        with self._lock:
            self._repos[(repo.repo_type, repo.repo_id)] = _Repo(repo.repo_id, repo.repo_type, oid, files)
            self.commits.setdefault(repo.repo_id, []).append(
                {"oid": oid, "summary": header.get("summary"), "paths": paths,
                 "private": self._private.get(repo.repo_id)})
        return {"commitUrl": f"{self.url}/{repo.repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients pool connections like they do on the Hub
    server_version = "LocalHub/1"

    @property
    def hub(self) -> LocalHub:
        return self.server.hub  # type: ignore[attr-defined]

    def setup(self) -> None:
        super().setup()
        self.hub._track(self.connection, True)

    def finish(self) -> None:
        self.hub._track(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass  # the client went away mid-response

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the record in hub.requests is the log

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_CONNECT(self) -> None:
        # An https request through the proxy of client_env(): refuse, it would have left the machine.
        self.hub._record(RecordedRequest("CONNECT", self.path, self._headers()))
        self._send_json(403, {"error": "LocalHub does not tunnel to other hosts"})

    # -- routing -----------------------------------------------------------------------------
    def _search_api(self, segments: list[str], raw_query: str) -> bool:
        return _search(self, segments, raw_query)  # the Search section at the end of this file

    def _headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def _dispatch(self) -> None:
        self.hub._record(RecordedRequest(self.command, self.path, self._headers()))
        url = urlsplit(self.path)
        if self._upload_route(url.path):
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if url.netloc and url.hostname not in ("127.0.0.1", "localhost"):
            # A proxied request for another host (datasets' dataset-viewer probe): not served here.
            self._send_json(404, {"error": f"LocalHub does not serve {url.netloc}"})
            return
        segments = [unquote(s) for s in url.path.strip("/").split("/")]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if self._search_api(segments, url.query):
                return
            if segments[0] == "api" and len(segments) > 2 and segments[1] in _REPO_TYPES:
                self._api(_REPO_TYPES[segments[1]], segments[2:], query, body)
            elif "resolve" in segments and self.command in ("GET", "HEAD"):
                repo_type = "dataset" if segments[0] == "datasets" else "model"
                self._resolve(repo_type, segments[1:] if repo_type == "dataset" else segments)
            else:
                self._send_json(404, {"error": f"LocalHub has no endpoint {self.command} {url.path}"})
        except _HubError as e:
            self._send_hub_error(e)

    def _send_hub_error(self, e: _HubError) -> None:
        headers = {"X-Error-Code": e.code, "X-Error-Message": str(e)} if e.code else {}
        if e.commit:
            headers["X-Repo-Commit"] = e.commit
        self._send_json(e.status, {"error": str(e)}, headers)

    def _api(self, repo_type: str, segments: list[str], query: dict[str, str], body: bytes) -> None:
        repo, rest = self.hub._find_repo(repo_type, segments)
        if len(rest) == 2 and rest[0] in ("preupload", "commit") and self.command == "POST":
            self._upload_api(repo, rest[0], rest[1], body)
            return
        expand = query.get("expand", "").lower() in ("1", "true")
        if not rest and self.command == "GET":
            self._send_json(200, self.hub._info(repo))
        elif len(rest) == 2 and rest[0] == "revision" and self.command == "GET":
            self.hub._check_revision(repo, rest[1])
            self._send_json(200, self.hub._info(repo))
        elif len(rest) >= 2 and rest[0] == "tree" and self.command == "GET":
            self.hub._check_revision(repo, rest[1])
            recursive = query.get("recursive", "").lower() in ("1", "true")
            self._send_json(200, self.hub._tree(repo, "/".join(rest[2:]).strip("/"), recursive, expand))
        elif len(rest) == 2 and rest[0] == "paths-info" and self.command == "POST":
            self.hub._check_revision(repo, rest[1])
            paths, expand = self._paths_info_form(body)
            self._send_json(200, self.hub._paths_info(repo, paths, expand))
        else:
            self._send_json(404, {"error": f"LocalHub has no endpoint {self.command} {self.path}"})

    def _paths_info_form(self, body: bytes) -> tuple[list[str], bool]:
        # huggingface_hub posts a form (paths=a&paths=b&expand=false); accept JSON too.
        if "json" in (self.headers.get("Content-Type") or ""):
            data = json.loads(body or b"{}")
            paths, expand = data.get("paths", []), data.get("expand", False)
            return ([paths] if isinstance(paths, str) else list(paths)), bool(expand)
        form = parse_qs(body.decode())
        return form.get("paths", []), form.get("expand", ["false"])[-1].lower() in ("1", "true")

    # -- uploads -----------------------------------------------------------------------------
    def _upload_route(self, path: str) -> bool:
        """Answer an upload endpoint that is not under /api/{type}s/{repo}/ (create, LFS batch, PUT, verify);
        False for any other path."""
        segments = [unquote(s) for s in path.strip("/").split("/")]
        try:
            if segments == ["api", "repos", "create"] and self.command == "POST":
                self.hub._authorize("create", self._headers())
                status, payload = self.hub._create_repo(json.loads(self._read_body() or b"{}"))
                self._send_json(status, payload)
            elif segments == ["api", "validate-yaml"] and self.command == "POST":
                errors = _metadata_errors(json.loads(self._read_body() or b"{}").get("content", ""))
                self._send_json(400 if errors else 200, {"errors": [{"message": m} for m in errors], "warnings": []})
            elif segments[-4:] == ["info", "lfs", "objects", "batch"] and self.command == "POST":
                self._lfs_batch(segments[:-4], json.loads(self._read_body() or b"{}"))
            elif segments[:1] == ["lfs-objects"] and self.command == "PUT":
                self._lfs_put(segments[1])
            elif segments == ["lfs-objects", "verify"] and self.command == "POST":
                data = json.loads(self._read_body() or b"{}")
                known = data.get("oid") in self.hub.lfs_objects
                self._send_json(200 if known else 404, {"success": known})
            else:
                return False
        except _HubError as e:
            self._send_hub_error(e)
        return True

    def _read_body(self) -> bytes:
        """The request body, by Content-Length or chunked."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _lfs_batch(self, segments: list[str], payload: dict[str, Any]) -> None:
        repo_type = "dataset" if segments[:1] == ["datasets"] else "model"
        segments = segments[1:] if repo_type == "dataset" else segments
        segments[-1] = segments[-1].removesuffix(".git")
        self.hub._find_repo(repo_type, segments)
        self.hub._authorize("batch", self._headers())
        objects = []
        for obj in payload.get("objects", []):
            entry: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.hub.lfs_objects:           # stored already: no actions, the client skips it
                entry["actions"] = {"upload": {"href": f"{self.hub.url}/lfs-objects/{obj['oid']}", "header": {}},
                                    "verify": {"href": f"{self.hub.url}/lfs-objects/verify", "header": {}}}
            objects.append(entry)
        self._send_json(200, {"transfer": "basic", "objects": objects})

    def _lfs_put(self, oid: str) -> None:
        if "upload" in self.hub.refuse:
            self._read_body()                        # the body first: the connection stays usable
            status, message = self.hub.refuse["upload"]
            raise _HubError(status, "Refused", message)
        length = int(self.headers.get("Content-Length") or 0)
        with self.hub._lock:
            drop = self.hub.drop_uploads > 0 and length > 1
            self.hub.drop_uploads -= 1 if drop else 0
        if drop:                                     # half the body, then the connection goes, unanswered
            self.rfile.read(length // 2)
            self.hub.lfs_puts.append((oid, False))
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        data = self._read_body()
        complete = hashlib.sha256(data).hexdigest() == oid
        self.hub.lfs_puts.append((oid, complete))
        if not complete:
            raise _HubError(400, "BadUpload", "the uploaded bytes do not match their sha256")
        self.hub.lfs_objects[oid] = data
        self._send(200, {"Content-Length": "0"})

    def _upload_api(self, repo: _Repo, endpoint: str, revision: str, body: bytes) -> None:
        self.hub._check_revision(repo, revision)
        self.hub._authorize(endpoint, self._headers())
        if endpoint == "preupload":
            files = []
            for f in json.loads(body or b"{}").get("files", []):
                binary = b"\0" in base64.b64decode(f.get("sample", ""))
                lfs = binary or f["size"] >= LFS_UPLOAD_SIZE            # the Hub's rule without .gitattributes
                known = repo.files.get(f["path"])
                oid = None if known is None else known.sha256 if lfs else known.blob_oid
                files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                              "oid": oid})
            self._send_json(200, {"files": files, "commitOid": repo.sha})
            return
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        with self.hub._lock:
            drop = self.hub.drop_commits > 0
            self.hub.drop_commits -= 1 if drop else 0
        if drop:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send_json(200, self.hub._commit(repo, lines))

    # -- files -------------------------------------------------------------------------------
    def _resolve(self, repo_type: str, segments: list[str]) -> None:
        repo, rest = self.hub._find_repo(repo_type, segments)
        if len(rest) < 3 or rest[0] != "resolve":
            raise _HubError(404, None, "Not found")
        self.hub._check_revision(repo, rest[1])
        f = repo.files.get("/".join(rest[2:]))
        if f is None:
            raise _HubError(404, "EntryNotFound", "Entry not found", repo.sha)
        etag = f'"{f.sha256 or f.blob_oid}"'
        headers = {"X-Repo-Commit": repo.sha, "ETag": etag, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if f.sha256:
            headers.update({"X-Linked-Etag": etag, "X-Linked-Size": str(self.hub._reported_size(repo, f))})
        if self.command == "HEAD":
            self._send(200, {**headers, "Content-Length": str(self.hub._reported_size(repo, f))})
            return
        start, end = self._byte_range(len(f.data))
        if start is None:
            self._send(416, {**headers, "Content-Range": f"bytes */{len(f.data)}", "Content-Length": "0"})
            return
        status = 200 if self.headers.get("Range") is None else 206
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(f.data)}"
        self._send(status, {**headers, "Content-Length": str(end - start)})
        self._send_body(f.data[start:end], self.hub.stall_after.get((repo.repo_id, f.path)))

    def _byte_range(self, size: int) -> tuple[int | None, int]:
        """[start, end) of the requested Range; (None, 0) when it is not satisfiable."""
        header = self.headers.get("Range")
        if header is None:
            return 0, size
        match = _RANGE.match(header.strip())
        if match is None or match.groups() == ("", ""):
            return None, 0
        first, last = match.groups()
        if first == "":  # bytes=-n: the last n bytes
            return (max(size - int(last), 0), size) if int(last) > 0 and size > 0 else (None, 0)
        start, end = int(first), (min(int(last) + 1, size) if last else size)
        return (start, end) if start < size and start < end else (None, 0)

    def _send_body(self, data: bytes, stall_after: int | None) -> None:
        sent = 0
        try:
            while sent < len(data) or stall_after == sent:
                if stall_after is not None and sent >= stall_after:
                    stall_after = None
                    if not self.hub._wait_for_release():
                        break
                    continue
                limit = len(data) if stall_after is None else min(stall_after, len(data))
                chunk = data[sent:min(sent + CHUNK_BYTES, limit)]
                self.wfile.write(chunk)
                self.wfile.flush()
                sent += len(chunk)
                if self.hub.delay_s and self.hub._stopping.wait(self.hub.delay_s):
                    break
        except OSError:
            pass  # the client hung up, as a killed download does
        if sent < len(data):
            self.close_connection = True  # the promised Content-Length was not sent

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)
        except OSError:
            self.close_connection = True

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self._send(status, {**(headers or {}), "Content-Type": "application/json; charset=utf-8",
                            "Content-Length": str(len(body))}, body)


# -- Search --------------------------------------------------------------------------------------
# GET /api/models (or /api/datasets) as HfApi.list_models / list_datasets call it in huggingface_hub 2.5
# (hf_api.py list_models, utils/_pagination.py): params search (a substring of the repo id, matched
# case-insensitively as the Hub does), limit, full, expand (repeated: expand=siblings&expand=sha); pages follow
# the "next" URL of a GitHub-style Link header. Like the Hub, a sibling here is only {"rfilename"}: sizes come
# from the tree endpoint (list_repo_tree), which a client asks per repo.

SEARCH_PAGE = 1000                       # repos per page when the request sets no smaller limit
_DEFAULT_FIELDS = ("id", "likes", "downloads", "private", "tags", "pipeline_tag", "library_name", "createdAt")


def _search_entry(hub: LocalHub, repo: _Repo, expand: list[str], full: bool) -> dict[str, Any]:
    info = hub._info(repo)
    info["siblings"] = [{"rfilename": s["rfilename"]} for s in info["siblings"]]
    if full:
        return info
    keep = set(expand) if expand else set(_DEFAULT_FIELDS)
    return {"_id": info["_id"], "id": repo.repo_id, **{k: v for k, v in info.items() if k in keep}}


def _search(self: _Handler, segments: list[str], raw_query: str) -> bool:
    """Answer GET /api/models|datasets (the search); False for any other request."""
    if self.command != "GET" or len(segments) != 2 or segments[0] != "api" or segments[1] not in _REPO_TYPES:
        return False
    params = parse_qs(raw_query)
    repo_type = _REPO_TYPES[segments[1]]
    term = params.get("search", [""])[-1].lower()
    limit = int(params.get("limit", [SEARCH_PAGE])[-1])
    offset = int(params.get("offset", ["0"])[-1])
    expand = params.get("expand", [])
    full = params.get("full", ["false"])[-1].lower() in ("1", "true")
    matches = sorted((r for (t, rid), r in self.hub._repos.items() if t == repo_type and term in rid.lower()),
                     key=lambda r: r.repo_id)
    page = matches[offset:offset + min(limit, SEARCH_PAGE)]
    headers = {}
    if offset + len(page) < len(matches):
        query = urlencode([(k, v) for k, values in params.items() if k != "offset" for v in values]
                          + [("offset", offset + len(page))])
        headers["Link"] = f'<{self.hub.url}/api/{segments[1]}?{query}>; rel="next"'
    self._send_json(200, [_search_entry(self.hub, r, expand, full) for r in page], headers)
    return True


def go_online(monkeypatch: Any, url: str) -> None:
    """This test process asks the Hub at `url` from now on, online: HF_ENDPOINT set, HF_HUB_OFFLINE (which the
    suite sets, and huggingface_hub reads once, at import) unset in the environment and in the library."""
    import huggingface_hub.constants as constants
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
