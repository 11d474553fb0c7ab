"""The local Hub stand-in works with the real huggingface_hub and datasets clients."""
from __future__ import annotations

import hashlib
import http.client
import json
import select
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_server import LocalHub, parquet_bytes  # noqa: E402

MODEL = "callgg/pig-clip-tokenizer"
DATASET = "someorg/prompts"
PARQUET = "data/train-00000-of-00001.parquet"
ROWS = [{"text": f"a cat in a castle {i}", "n": i} for i in range(7)]
BIG = bytes(range(256)) * 160  # 40 KiB: LFS-sized and several 16 KiB chunks
MODEL_FILES = {
    "config.json": b'{"hidden_size": 64}',
    "tokenizer.json": b'{"vocab": {}}',
    "sub/dir/file.bin": b"\x00\x01\x02nested",
    "big.gguf": BIG,
    "README.md": b"# not wanted\n",
}


@pytest.fixture
def online(monkeypatch):
    """Undo conftest's HF_HUB_OFFLINE=1 for this process; huggingface_hub read it at import."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub(online):
    with LocalHub({MODEL: MODEL_FILES, DATASET: {PARQUET: parquet_bytes(ROWS)}},
                  repo_types={DATASET: "dataset"}) as hub:
        yield hub


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
        return r.status, dict(r.headers), r.read()


def test_snapshot_download_fetches_exactly_the_matching_files(hub, tmp_path):
    local = tmp_path / "tok"
    snapshot_download(MODEL, allow_patterns=["*.json", "sub/**", "*.gguf"], local_dir=local,
                      endpoint=hub.url, token=False)
    got = {p.relative_to(local).as_posix(): p.read_bytes()
           for p in local.rglob("*") if p.is_file() and ".cache" not in p.parts}
    assert got == {k: v for k, v in MODEL_FILES.items() if k != "README.md"}
    sha = hub.commit_sha(MODEL)
    calls = [(r.method, r.path.split("?")[0]) for r in hub.requests]
    assert calls[:2] == [("GET", f"/api/models/{MODEL}/revision/main"), ("GET", f"/api/models/{MODEL}/tree/{sha}")]
    assert ("GET", f"/{MODEL}/resolve/{sha}/sub/dir/file.bin") in calls
    assert not any("README.md" in path for _, path in calls)


def test_repo_info_and_tree_listings(hub):
    api = HfApi(endpoint=hub.url, token=False)
    info = api.model_info(MODEL, files_metadata=True)
    assert info.sha == hub.commit_sha(MODEL)
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes == {k: len(v) for k, v in MODEL_FILES.items()}
    lfs = {s.rfilename: s.lfs for s in info.siblings if s.lfs}
    assert list(lfs) == ["big.gguf"] and lfs["big.gguf"].sha256 == hashlib.sha256(BIG).hexdigest()

    tree = list(api.list_repo_tree(MODEL, recursive=True))
    assert {e.path for e in tree if hasattr(e, "size")} == set(MODEL_FILES)
    assert {e.path for e in tree if not hasattr(e, "size")} == {"sub", "sub/dir"}
    assert [e.path for e in api.list_repo_tree(MODEL, path_in_repo="sub")] == ["sub/dir"]
    paths = api.get_paths_info(MODEL, ["config.json", "sub", "missing.txt"])
    assert [p.path for p in paths] == ["config.json", "sub"]

    dataset = api.dataset_info(DATASET, files_metadata=True)
    assert [(s.rfilename, s.size) for s in dataset.siblings] == [(PARQUET, len(parquet_bytes(ROWS)))]


def test_file_metadata_and_range_requests(hub):
    meta = get_hf_file_metadata(hf_hub_url(MODEL, "big.gguf", endpoint=hub.url), token=False)
    assert (meta.size, meta.etag, meta.commit_hash) == (len(BIG), hashlib.sha256(BIG).hexdigest(),
                                                         hub.commit_sha(MODEL))
    small = get_hf_file_metadata(hf_hub_url(MODEL, "config.json", endpoint=hub.url), token=False)
    data = MODEL_FILES["config.json"]
    assert small.etag == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    url = hf_hub_url(MODEL, "big.gguf", endpoint=hub.url)
    status, headers, body = _get(url, {"Range": "bytes=100-"})
    assert (status, headers["Content-Range"], body) == (206, f"bytes 100-{len(BIG) - 1}/{len(BIG)}", BIG[100:])
    assert _get(url, {"Range": "bytes=10-19"})[2] == BIG[10:20]
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(url, {"Range": f"bytes={len(BIG)}-"})
    assert e.value.code == 416
    assert [r.headers.get("range") for r in hub.requests if r.method == "GET"][0] == "bytes=100-"


def test_fake_sizes_change_what_is_reported_not_what_is_sent(hub):
    hub.fake_sizes[(MODEL, "big.gguf")] = 10**15
    api = HfApi(endpoint=hub.url, token=False)
    assert get_hf_file_metadata(hf_hub_url(MODEL, "big.gguf", endpoint=hub.url), token=False).size == 10**15
    assert {s.rfilename: s.size for s in api.model_info(MODEL, files_metadata=True).siblings}["big.gguf"] == 10**15
    assert {e.path: getattr(e, "size", None) for e in api.list_repo_tree(MODEL)}["big.gguf"] == 10**15
    assert _get(hf_hub_url(MODEL, "big.gguf", endpoint=hub.url))[2] == BIG


def _stalled_get(hub: LocalHub, path: str, offset: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    port = int(hub.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", f"/{MODEL}/resolve/main/{path}", headers={"Range": f"bytes={offset}-"})
    return conn, conn.getresponse()


def test_stall_after_hangs_until_release(hub):
    hub.stall_after[(MODEL, "big.gguf")] = 1000
    conn, response = _stalled_get(hub, "big.gguf", 50)
    assert response.status == 206 and response.read(1000) == BIG[50:1050]
    assert hub.stalled.wait(5)
    # A 0.3 s client read timeout sees nothing more arrive (select, because a socket file
    # object that once timed out refuses further reads).
    assert select.select([conn.sock], [], [], 0.3)[0] == []
    assert _get(hf_hub_url(MODEL, "config.json", endpoint=hub.url))[2] == MODEL_FILES["config.json"]
    hub.release()
    assert response.read() == BIG[1050:]
    conn.close()


def test_hf_hub_download_resumes_a_stalled_file_with_a_range(hub, tmp_path, monkeypatch):
    # http_get counts only the chunks it has yielded (10 MiB each by default) and retries a
    # read timeout after sleeping 1 s; small chunks and timeout make that quick to see.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.3)
    hub.stall_after[(MODEL, "big.gguf")] = 20_000

    def unstall() -> None:
        hub.stalled.wait(5)
        hub.stall_after.clear()  # the retry, 1 s later, gets the rest

    helper = threading.Thread(target=unstall)
    helper.start()
    path = hf_hub_download(MODEL, "big.gguf", endpoint=hub.url, cache_dir=tmp_path, token=False)
    helper.join()
    assert Path(path).read_bytes() == BIG
    ranges = [r.headers.get("range") for r in hub.requests if r.method == "GET"]
    assert ranges[0] is None and ranges[-1] == "bytes=16384-"


def test_stop_ends_stalled_and_slow_downloads(online):
    hub = LocalHub({MODEL: MODEL_FILES}).start()
    hub.stall_after[(MODEL, "big.gguf")] = 10
    stalled_conn, stalled = _stalled_get(hub, "big.gguf", 0)
    assert stalled.read(10) == BIG[:10] and hub.stalled.wait(5)
    hub.delay_s = 60.0  # one chunk, then a minute's pause that stop() must cut short
    slow_conn, slow = _stalled_get(hub, "config.json", 0)
    # the chunk arrives before the pause (read now: the headers alone do not say the body was written yet)
    assert slow.read(len(MODEL_FILES["config.json"])) == MODEL_FILES["config.json"]
    started = time.monotonic()
    hub.stop()
    assert time.monotonic() - started < 3
    with pytest.raises(http.client.IncompleteRead):
        stalled.read()
    stalled_conn.close()
    slow_conn.close()


def test_unknown_repo_file_and_revision_raise_hub_errors(hub, tmp_path):
    api = HfApi(endpoint=hub.url, token=False)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("nobody/nothing")
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info(MODEL)  # a model repo is not a dataset
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("nobody/nothing", "config.json", endpoint=hub.url, cache_dir=tmp_path, token=False)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(MODEL, "missing.json", endpoint=hub.url, cache_dir=tmp_path, token=False)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(MODEL, revision="v9")


# Both modes in one child process: importing datasets is the slow part.
LOAD_BOTH = """
import datasets, json
rows = list(datasets.load_dataset("someorg/prompts", split="train"))
streamed = list(datasets.load_dataset("someorg/prompts", split="train", streaming=True))
print(json.dumps({"rows": rows, "streamed": streamed}))
"""


def test_datasets_load_dataset_reads_a_served_parquet(hub, tmp_path):
    r = subprocess.run([sys.executable, "-c", LOAD_BOTH], env=hub.client_env(tmp_path), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {"rows": ROWS, "streamed": ROWS}
    paths = [r.path for r in hub.requests]
    assert any(p.endswith(f"/resolve/{hub.commit_sha(DATASET)}/{PARQUET}") for p in paths)
    assert any("/info?dataset=" in p for p in paths)  # the dataset-viewer probe came here, not to the network
    assert not [r for r in hub.requests if r.method == "CONNECT"]  # nothing tried to leave over https


# -- the search (GET /api/models), for the student finder ---------------------------------------------------------

def test_list_models_searches_ids_and_follows_the_pages(online, monkeypatch):
    import hub_server
    repos = {"a/pig_clip-gguf": {"pig_clip-f16.gguf": b"x"}, "B/PIG_CLIP-q": {"x.gguf": b"y"},
             "c/other": {"pig_clip.gguf": b"z"}, "d/pig_clip_three": {"README.md": b"r"}}
    monkeypatch.setattr(hub_server, "SEARCH_PAGE", 2)                   # three matches: two pages
    with LocalHub(repos) as h:
        api = HfApi(endpoint=h.url)
        found = list(api.list_models(search="pig_clip", expand=["siblings"]))
        assert [m.id for m in found] == ["B/PIG_CLIP-q", "a/pig_clip-gguf", "d/pig_clip_three"]   # not c/other
        assert [[s.rfilename for s in m.siblings] for m in found] == [["x.gguf"], ["pig_clip-f16.gguf"], ["README.md"]]
        assert all(s.size is None for m in found for s in m.siblings)          # sizes come from the tree, as on the Hub
        pages = [q.path for q in h.requests if q.path.startswith("/api/models?")]
        assert len(pages) == 2 and "offset=2" in pages[1] and "expand=siblings" in pages[1]
        assert [m.id for m in api.list_models(search="pig_clip", limit=1)] == ["B/PIG_CLIP-q"]
        plain = next(iter(api.list_models(search="other")))
        assert (plain.id, plain.siblings, plain.downloads) == ("c/other", None, 0)
