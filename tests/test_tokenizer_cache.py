"""The offline Qwen tokenizer is built once per machine: later processes read the user's cache
(packs/common/tiny_models.py, base/folder.cache_dir), and a cache that is damaged, built from other
ranks or cannot be written never changes what write_qwen_tokenizer writes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_core.base.errors import DiskFullError
from trainer_core.packs.common import tiny_models


@pytest.fixture
def builds(monkeypatch, tmp_path):
    """A cache folder of the test's own, a fresh lru_cache, and the real build counted."""
    monkeypatch.setenv("GGUF_TRAINER_CACHE", str(tmp_path / "cache"))
    real = tiny_models._build_tokenizer_files
    made: list[int] = []
    # the real build on the first 300 ranks: the same code, a fraction of the time
    monkeypatch.setattr(tiny_models, "_build_tokenizer_files",
                        lambda ranks: made.append(1) or real(dict(sorted(ranks.items(), key=lambda i: i[1])[:300])))
    tiny_models._qwen_tokenizer_files.cache_clear()
    yield made
    tiny_models._qwen_tokenizer_files.cache_clear()


def fresh_files() -> dict[str, str]:
    tiny_models._qwen_tokenizer_files.cache_clear()
    return tiny_models._qwen_tokenizer_files()


def cached_folder(tmp_path: Path) -> Path:
    (folder,) = (tmp_path / "cache" / "qwen-tokenizer").iterdir()
    return folder


def test_the_second_process_reads_the_cache_and_writes_the_same_files(builds, tmp_path):
    first = tiny_models.write_qwen_tokenizer(tmp_path / "a")
    assert builds == [1]
    folder = cached_folder(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*tiny_models._TOKENIZER_NAMES, "complete.json"])
    fresh_files()                                                   # a new process: the cache, no build
    second = tiny_models.write_qwen_tokenizer(tmp_path / "b")
    assert builds == [1]
    for name in tiny_models._TOKENIZER_NAMES:
        assert (first / name).read_bytes() == (second / name).read_bytes() == (folder / name).read_bytes()


def test_a_damaged_or_unfinished_cache_is_built_again(builds, tmp_path):
    built = fresh_files()
    folder = cached_folder(tmp_path)
    (folder / "merges.txt").write_text("#version: 0.2\nx y\n", encoding="utf-8")    # not what complete.json says
    assert fresh_files() == built and builds == [1, 1]
    (folder / "complete.json").unlink()                             # a process died before it finished
    assert fresh_files() == built and builds == [1, 1, 1]
    digests = json.loads((folder / "complete.json").read_text(encoding="utf-8"))
    assert set(digests) == set(tiny_models._TOKENIZER_NAMES)


def test_other_ranks_get_their_own_cache(builds, tmp_path, monkeypatch):
    fresh_files()
    source = tiny_models._qwen_tiktoken()
    monkeypatch.setattr(tiny_models, "_qwen_tiktoken", lambda: source + b"\n")   # another qwen-tokenizer release
    fresh_files()
    assert builds == [1, 1] and len(list((tmp_path / "cache" / "qwen-tokenizer").iterdir())) == 2


@pytest.mark.parametrize("refusal", [PermissionError(13, "Permission denied"),
                                     DiskFullError("the disk holding the cache is full")], ids=["read-only", "full"])
def test_a_cache_that_cannot_be_written_costs_a_build_not_the_tokenizer(builds, tmp_path, refusal):
    with pytest.MonkeyPatch.context() as mp:
        def refuse(*args, **kwargs):
            raise refusal
        mp.setattr(tiny_models, "atomic_write_json", refuse)        # complete.json, written last, never lands
        out = tiny_models.write_qwen_tokenizer(tmp_path / "a")
    assert builds == [1]
    again = tiny_models.write_qwen_tokenizer(tmp_path / "b")        # this process keeps what it built
    assert builds == [1]
    assert fresh_files() == {n: (out / n).read_text(encoding="utf-8") for n in tiny_models._TOKENIZER_NAMES}
    assert builds == [1, 1]                                         # the next process builds, and now caches
    assert (again / "vocab.json").read_bytes() == (out / "vocab.json").read_bytes()
    assert (cached_folder(tmp_path) / "complete.json").is_file()
