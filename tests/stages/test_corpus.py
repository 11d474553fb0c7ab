"""The corpus stage (text packs): prompt files -> data/train.txt and data/val.txt.

Expected values come from the reference rules (B.5), computed here by hand:
each text normalised with " ".join(text.split()), kept iff min_chars <= len <= max_chars,
de-duplicated case-insensitively (first wins); val = n_val prompts, train = the next
n_train; train gets int(len(train) * empty_frac) empty prompts, val gets
max(1, int(len(val) * empty_frac)) when empty_frac > 0.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import write_prompts
from trainer_core.base.errors import CorpusError
from trainer_core.base.events import ListReport
from trainer_core.project import Project
from trainer_core.stages import corpus
from trainer_core.contract.corpus_files import read_corpus, write_corpus
from trainer_core.stages.corpus import read_prompt_file, run


# ---------------------------------------------------------------- helpers

def make_project(root: Path, files: list[Path], *assignments: str, n_val: int = 40) -> Project:
    project = Project.create(root, "llada_image")
    project.update_settings([
        "corpus.presets=[]",
        "corpus.extra_files=" + json.dumps([str(f) for f in files]),
        f"corpus.n_val={n_val}",
        *assignments,
    ])
    return project


def file_lines(path: Path) -> list[str]:
    """The lines of a corpus file, read independently of read_corpus."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "every line ends in a newline"
    return data.decode("utf-8").split("\n")[:-1] if data else []


def normalised(text: str) -> str:
    return " ".join(text.split())


def reference_pool(texts: list[str], lo: int = 8, hi: int = 1200) -> list[str]:
    seen, pool = set(), []
    for t in texts:
        t = normalised(t)
        if lo <= len(t) <= hi and t.lower() not in seen:
            seen.add(t.lower())
            pool.append(t)
    return pool


def no_corpus_written(project: Project) -> bool:
    data = project.data_dir
    return not data.exists() or list(data.iterdir()) == []


@pytest.fixture
def prompts600(tmp_path) -> tuple[Path, list[str]]:
    path = tmp_path / "prompts.txt"
    return path, write_prompts(path, 600, seed=1)


# ---------------------------------------------------------------- the split

@pytest.mark.parametrize("empty_frac, train_empty, val_empty", [
    # 560 train and 40 val prompts: int(560*f) and max(1, int(40*f)), worked out by hand
    ("0.01", 5, 1),
    ("0.1", 56, 4),
    ("0.5", 280, 20),
    ("0", 0, 0),
])
def test_split_sizes_and_empty_counts(tmp_path, prompts600, empty_frac, train_empty, val_empty):
    path, prompts = prompts600
    project = make_project(tmp_path / "p", [path], f"corpus.empty_frac={empty_frac}")
    assert run(project, ListReport()) == "done"
    train = file_lines(project.data_dir / "train.txt")
    val = file_lines(project.data_dir / "val.txt")
    assert len(val) == 40
    assert len(train) == 560
    assert train.count("") == train_empty
    assert val.count("") == val_empty
    inputs = set(prompts)
    nonempty_train = [p for p in train if p]
    nonempty_val = [p for p in val if p]
    assert set(nonempty_train) <= inputs
    assert set(nonempty_val) <= inputs
    assert not set(nonempty_train) & set(nonempty_val)
    assert len(set(nonempty_train)) == len(nonempty_train)
    assert len(set(nonempty_val)) == len(nonempty_val)
    # every prompt of the pool is used; the empty ones replace prompts, they are not added
    assert len(nonempty_train) + len(nonempty_val) == 600 - train_empty - val_empty


def test_filtering_normalising_and_dedup(tmp_path):
    base = write_prompts(tmp_path / "base.txt", 200, seed=2)
    extra = [
        "tiny",                             # 4 chars: too short
        "1234567",                          # 7 chars: too short
        "12345678",                         # 8 chars: kept (min_chars is inclusive)
        "   ab    cd  ",                    # "ab cd": 5 chars after normalising
        "  A   lonely\tlighthouse   at dusk  ",
        "a lonely LIGHTHOUSE at dusk",      # case-insensitive duplicate after normalising
        "Z" * 1200,                         # kept (max_chars is inclusive)
        "Y" * 1201,                         # too long
        "W " * 700,                         # 1399 chars: too long even after normalising
        "",
        "   ",
        base[0].upper(),                    # duplicate of an earlier prompt
        "Red\u00a0sky over\u2003the sea",   # unicode spaces normalise too
    ]
    second = tmp_path / "second.txt"
    second.write_text("\n".join(extra) + "\n", encoding="utf-8")
    texts = base + extra
    expected = reference_pool(texts)
    # worked out by hand: the 200 base prompts plus these four
    assert expected == base + ["12345678", "A lonely lighthouse at dusk", "Z" * 1200,
                               "Red sky over the sea"]
    project = make_project(tmp_path / "p", [tmp_path / "base.txt", second], "corpus.empty_frac=0")
    assert run(project, ListReport()) == "done"
    train = file_lines(project.data_dir / "train.txt")
    val = file_lines(project.data_dir / "val.txt")
    assert len(val) == 40 and len(train) == 204 - 40
    assert sorted(train + val) == sorted(expected)


def test_min_and_max_chars_settings(tmp_path):
    lengths = list(range(5, 400))      # one prompt of each length, all distinct
    texts = [f"{n:04d}" + "q" * (n - 4) for n in lengths]
    src = tmp_path / "lengths.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    project = make_project(tmp_path / "p", [src], "corpus.min_chars=20", "corpus.max_chars=300",
                           "corpus.empty_frac=0")
    assert run(project, ListReport()) == "done"
    got = file_lines(project.data_dir / "train.txt") + file_lines(project.data_dir / "val.txt")
    assert sorted(len(t) for t in got) == list(range(20, 301))


def test_n_train_limits_train_and_warns_when_short(tmp_path, prompts600):
    path, _ = prompts600
    project = make_project(tmp_path / "p", [path], "corpus.n_train=300")
    rep = ListReport()
    assert run(project, rep) == "done"
    train = file_lines(project.data_dir / "train.txt")
    assert len(train) == 300
    assert train.count("") == 3          # int(300 * 0.01)
    assert not [w for w in rep.of_type("log") if w["level"] == "warning"]

    project2 = make_project(tmp_path / "p2", [path])    # n_train 60000 by default
    rep2 = ListReport()
    assert run(project2, rep2) == "done"
    warnings = [w["message"] for w in rep2.of_type("log") if w["level"] == "warning"]
    assert len(warnings) == 1
    assert "560" in warnings[0] and "60000" in warnings[0]


def test_same_seed_same_files_other_seed_other_order(tmp_path, prompts600):
    path, _ = prompts600
    a = make_project(tmp_path / "a", [path], "corpus.empty_frac=0")
    b = make_project(tmp_path / "b", [path], "corpus.empty_frac=0")
    c = make_project(tmp_path / "c", [path], "corpus.empty_frac=0", "corpus.seed=9")
    for p in (a, b, c):
        assert run(p, ListReport()) == "done"
    for name in ("train.txt", "val.txt"):
        assert (a.data_dir / name).read_bytes() == (b.data_dir / name).read_bytes()
    first = (a.data_dir / "train.txt").read_bytes()
    assert run(a, ListReport()) == "done"            # a second run gives the same files
    assert (a.data_dir / "train.txt").read_bytes() == first

    train_a, val_a = file_lines(a.data_dir / "train.txt"), file_lines(a.data_dir / "val.txt")
    train_c, val_c = file_lines(c.data_dir / "train.txt"), file_lines(c.data_dir / "val.txt")
    assert train_a != train_c
    assert val_a != val_c
    assert sorted(train_a + val_a) == sorted(train_c + val_c)   # same pool, another order


def test_default_empty_frac_with_seeds(tmp_path, prompts600):
    """Different seeds, same rule: the empty counts do not depend on the seed."""
    path, _ = prompts600
    for seed in (0, 1, 12345):
        project = make_project(tmp_path / f"p{seed}", [path], f"corpus.seed={seed}")
        assert run(project, ListReport()) == "done"
        train = file_lines(project.data_dir / "train.txt")
        val = file_lines(project.data_dir / "val.txt")
        assert (len(train), train.count("")) == (560, 5)
        assert (len(val), val.count("")) == (40, 1)


def test_text_project_from_cli(text_project):
    project = Project.open(text_project)
    rep = ListReport()
    assert run(project, rep) == "done"
    assert len(file_lines(project.data_dir / "val.txt")) == 40
    assert len(file_lines(project.data_dir / "train.txt")) == 560


# ---------------------------------------------------------------- input formats

def test_jsonl_input(tmp_path):
    texts = [f"prompt number {i} with a 'quote' and \"double\" and ünïcode" for i in range(150)]
    rows = []
    for i, t in enumerate(texts):
        rows.append(json.dumps({"text": t, "id": i}, ensure_ascii=False))
        if i == 10:
            rows += ["", "   ", json.dumps({"caption": "no text field here"}),
                     json.dumps({"text": ""}), json.dumps({"text": "", "other": "x"})]
    src = tmp_path / "prompts.jsonl"
    src.write_text("\n".join(rows) + "\n\n", encoding="utf-8")
    assert list(read_prompt_file(src)) == texts
    project = make_project(tmp_path / "p", [src], "corpus.empty_frac=0")
    assert run(project, ListReport()) == "done"
    got = file_lines(project.data_dir / "train.txt") + file_lines(project.data_dir / "val.txt")
    assert sorted(got) == sorted(texts)


def test_jsonl_suffix_is_case_insensitive(tmp_path):
    src = tmp_path / "PROMPTS.JSONL"
    src.write_text('{"text": "first prompt here"}\n{"text": "second prompt here"}\n', encoding="utf-8")
    assert list(read_prompt_file(src)) == ["first prompt here", "second prompt here"]


def test_utf8_bom_is_ignored_txt(tmp_path):
    prompts = [f"bom prompt number {i}" for i in range(150)]
    src = tmp_path / "bom.txt"
    src.write_bytes(b"\xef\xbb\xbf" + "\n".join(prompts).encode("utf-8") + b"\n")
    got = [p for p in read_prompt_file(src) if p]
    assert got == prompts
    project = make_project(tmp_path / "p", [src], "corpus.empty_frac=0")
    assert run(project, ListReport()) == "done"
    out = file_lines(project.data_dir / "train.txt") + file_lines(project.data_dir / "val.txt")
    assert sorted(out) == sorted(prompts)
    assert not any("\ufeff" in p for p in out)


def test_utf8_bom_is_ignored_jsonl(tmp_path):
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + b'{"text": "first prompt"}\n{"text": "second prompt"}\n')
    assert list(read_prompt_file(src)) == ["first prompt", "second prompt"]


def test_crlf_line_endings(tmp_path):
    prompts = [f"windows prompt {i}" for i in range(150)]
    txt = tmp_path / "crlf.txt"
    txt.write_bytes("\r\n".join(prompts).encode("utf-8") + b"\r\n")
    got = list(read_prompt_file(txt))
    assert not any("\r" in p for p in got)
    assert [p for p in got if p] == prompts
    jsonl = tmp_path / "crlf.jsonl"
    jsonl.write_bytes(b"".join(json.dumps({"text": p}).encode() + b"\r\n" for p in prompts[:3]))
    assert list(read_prompt_file(jsonl)) == prompts[:3]
    project = make_project(tmp_path / "p", [txt], "corpus.empty_frac=0")
    assert run(project, ListReport()) == "done"
    for name in ("train.txt", "val.txt"):
        assert b"\r" not in (project.data_dir / name).read_bytes()
    out = file_lines(project.data_dir / "train.txt") + file_lines(project.data_dir / "val.txt")
    assert sorted(out) == sorted(prompts)


# ---------------------------------------------------------------- errors

def _bad_utf8(path: Path) -> None:
    path.write_bytes(b"first prompt is fine\nsecond prompt is fine\nthird \xff\xfe broken\nfourth ok\n")


def _bad_utf8_jsonl(path: Path) -> None:
    path.write_bytes(b'{"text": "first prompt"}\n{"text": "second prompt"}\n{"text": "\xff"}\n')


def _bad_json(path: Path) -> None:
    path.write_text('{"text": "first prompt is fine"}\n{"text": oops}\n{"text": "third"}\n')


def _json_list(path: Path) -> None:
    path.write_text('{"text": "first prompt is fine"}\n\n["a", "list"]\n')


def _bom_then_bad_utf8(path: Path) -> None:
    path.write_bytes(b"\xef\xbb\xbffirst prompt\n\xc3\n")


@pytest.mark.parametrize("name, writer, line", [
    ("bad.txt", _bad_utf8, 3),
    ("bad.jsonl", _bad_utf8_jsonl, 3),
    ("bad_json.jsonl", _bad_json, 2),
    ("list.jsonl", _json_list, 3),
    ("bom.txt", _bom_then_bad_utf8, 2),
])
def test_unreadable_content_names_file_and_line(tmp_path, prompts600, name, writer, line):
    good, _ = prompts600
    bad = tmp_path / name
    writer(bad)
    project = make_project(tmp_path / "p", [good, bad])
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    msg = str(info.value)
    assert str(bad) in msg
    assert re.search(rf"\bline {line}\b", msg), msg
    assert no_corpus_written(project)


def test_missing_file(tmp_path, prompts600):
    good, _ = prompts600
    missing = tmp_path / "nowhere" / "prompts.txt"
    project = make_project(tmp_path / "p", [good, missing])
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)
    assert no_corpus_written(project)


def test_relative_missing_file_is_named_from_the_project(tmp_path):
    project = make_project(tmp_path / "p", [Path("prompts/mine.txt")])
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    assert str(project.root / "prompts" / "mine.txt") in str(info.value)
    assert no_corpus_written(project)


def test_directory_given_as_file(tmp_path, prompts600):
    good, _ = prompts600
    folder = tmp_path / "a_folder"
    folder.mkdir()
    project = make_project(tmp_path / "p", [good, folder])
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    assert str(folder) in str(info.value)
    assert "folder" in str(info.value)
    assert no_corpus_written(project)


def test_unreadable_file(tmp_path, prompts600, monkeypatch):
    good, _ = prompts600
    locked = tmp_path / "locked.txt"
    write_prompts(locked, 10, seed=3)
    project = make_project(tmp_path / "p", [good, locked])
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):     # root reads anything: simulate the refusal
            real = Path.read_bytes

            def read_bytes(self):
                if self == locked:
                    raise PermissionError(13, "Permission denied")
                return real(self)
            monkeypatch.setattr(Path, "read_bytes", read_bytes)
        with pytest.raises(CorpusError) as info:
            run(project, ListReport())
    finally:
        locked.chmod(0o644)
    msg = str(info.value)
    assert str(locked) in msg
    assert "Permission denied" in msg
    assert no_corpus_written(project)


def test_too_few_prompts(tmp_path):
    base = write_prompts(tmp_path / "few.txt", 139, seed=4)
    # duplicates and too-short lines do not count
    with open(tmp_path / "few.txt", "a", encoding="utf-8") as f:
        f.write("".join(p.upper() + "\n" for p in base[:11]) + "short\n\n")
    project = make_project(tmp_path / "p", [tmp_path / "few.txt"])
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    msg = str(info.value)
    assert re.search(r"\b139\b", msg), msg      # usable prompts
    assert re.search(r"\b140\b", msg), msg      # n_val 40 + 100
    assert no_corpus_written(project)


def test_exactly_enough_prompts(tmp_path):
    write_prompts(tmp_path / "enough.txt", 140, seed=5)
    project = make_project(tmp_path / "p", [tmp_path / "enough.txt"])
    assert run(project, ListReport()) == "done"
    train = file_lines(project.data_dir / "train.txt")
    val = file_lines(project.data_dir / "val.txt")
    assert (len(train), train.count("")) == (100, 1)     # int(100 * 0.01) = 1
    assert (len(val), val.count("")) == (40, 1)          # max(1, int(0.4)) = 1


def test_presets_without_files(tmp_path):
    project = Project.create(tmp_path / "p", "llada_image")
    presets = project.settings.corpus.presets
    assert presets and project.settings.corpus.extra_files == []
    rep = ListReport()
    with pytest.raises(CorpusError) as info:
        run(project, rep)
    assert "corpus.extra_files" in str(info.value)
    warnings = [e for e in rep.of_type("log") if e["level"] == "warning"]
    assert len(warnings) == len(presets)
    for preset, warning in zip(presets, warnings):
        assert preset in warning["message"]
    assert no_corpus_written(project)


def test_no_source_at_all(tmp_path):
    project = make_project(tmp_path / "p", [])
    rep = ListReport()
    with pytest.raises(CorpusError) as info:
        run(project, rep)
    assert "corpus.extra_files" in str(info.value)
    assert rep.of_type("log") == []
    assert no_corpus_written(project)


# ---------------------------------------------------------------- files mode

def _files_project(tmp_path: Path, train: str, val: str) -> Project:
    project = Project.create(tmp_path / "p", "llada_image")
    project.update_settings(["corpus.mode=files", f"corpus.train_file={train}",
                             f"corpus.val_file={val}"])
    return project


def test_files_mode_uses_the_users_files(tmp_path):
    train = tmp_path / "my_train.txt"
    val = tmp_path / "my_val.txt"
    write_prompts(train, 50, seed=6)
    val.write_text("a val prompt\n\nanother val prompt ü\n", encoding="utf-8")
    before = (train.read_bytes(), val.read_bytes())
    project = _files_project(tmp_path, str(train), str(val))
    rep = ListReport()
    assert run(project, rep) == "done"
    assert not project.data_dir.exists()
    assert (train.read_bytes(), val.read_bytes()) == before
    assert project.corpus_files() == (train, val)
    assert {a["path"] for a in rep.of_type("artifact")} == {str(train), str(val)}


def test_files_mode_artifact_lines_count_the_lines(tmp_path):
    """The artifact's `lines` is the number of lines in the file (3 and 50 here)."""
    train = tmp_path / "my_train.txt"
    val = tmp_path / "my_val.txt"
    write_prompts(train, 50, seed=6)
    val.write_text("a val prompt\n\nanother val prompt\n", encoding="utf-8")
    project = _files_project(tmp_path, str(train), str(val))
    rep = ListReport()
    assert run(project, rep) == "done"
    lines = {a["path"]: a["lines"] for a in rep.of_type("artifact")}
    assert lines == {str(train): 50, str(val): 3}


@pytest.mark.parametrize("which", ["train", "val"])
def test_files_mode_missing_file(tmp_path, which):
    present = tmp_path / "present.txt"
    write_prompts(present, 20, seed=7)
    missing = tmp_path / "missing.txt"
    project = _files_project(tmp_path, str(missing if which == "train" else present),
                             str(missing if which == "val" else present))
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    msg = str(info.value)
    assert str(missing) in msg
    assert f"corpus.{which}_file" in msg
    assert not project.data_dir.exists()


def test_files_mode_empty_setting(tmp_path):
    train = tmp_path / "train.txt"
    val = tmp_path / "val.txt"
    write_prompts(train, 20, seed=8)
    write_prompts(val, 20, seed=9)
    project = _files_project(tmp_path, str(train), str(val))
    # the settings refuse files mode without both files; the stage guards on its own too
    project.settings.corpus.train_file = ""
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    assert "corpus.train_file" in str(info.value)
    assert not project.data_dir.exists()


def test_files_mode_invalid_utf8(tmp_path):
    train = tmp_path / "train.txt"
    val = tmp_path / "val.txt"
    write_prompts(train, 20, seed=9)
    val.write_bytes(b"ok line\n\xe9t\xe9 latin-1\n")
    project = _files_project(tmp_path, str(train), str(val))
    with pytest.raises(CorpusError) as info:
        run(project, ListReport())
    assert str(val) in str(info.value)
    assert re.search(r"\bline 2\b", str(info.value))


# ---------------------------------------------------------------- image packs

# ---------------------------------------------------------------- corpus files

def test_write_read_round_trip(tmp_path):
    prompts = ["", "first prompt", "", "", "second prompt ü", "third", "", ""]
    path = tmp_path / "c.txt"
    write_corpus(path, prompts)
    assert path.read_bytes() == "\nfirst prompt\n\n\nsecond prompt ü\nthird\n\n\n".encode("utf-8")
    assert read_corpus(path) == prompts


def test_write_corpus_flattens_newlines(tmp_path):
    path = tmp_path / "c.txt"
    write_corpus(path, ["one\ntwo", "", "three\n"])
    assert path.read_bytes() == b"one two\n\nthree \n"
    assert read_corpus(path) == ["one two", "", "three "]


def test_write_corpus_carriage_returns_keep_one_prompt_a_line(tmp_path):
    """A "\\r" or "\\r\\n" line break inside a prompt must not split it in two on reading."""
    path = tmp_path / "c.txt"
    prompts = ["one\rtwo", "three\r\nfour", "", "five"]
    write_corpus(path, prompts)
    back = read_corpus(path)
    assert len(back) == len(prompts)
    assert [normalised(p) for p in back] == ["one two", "three four", "", "five"]


def test_read_corpus_crlf(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"alpha\r\n\r\nbeta\r\n")
    assert read_corpus(path) == ["alpha", "", "beta"]


@pytest.mark.parametrize("prompts", [[], [""], ["only"]])
def test_round_trip_small_lists(tmp_path, prompts):
    path = tmp_path / "c.txt"
    write_corpus(path, prompts)
    assert path.read_bytes() == "".join(p + "\n" for p in prompts).encode()
    assert read_corpus(path) == prompts


def test_artifact_events_match_the_files(tmp_path, prompts600):
    path, _ = prompts600
    project = make_project(tmp_path / "p", [path], "corpus.empty_frac=0.05")
    rep = ListReport()
    assert run(project, rep) == "done"
    artifacts = {a["kind"]: a for a in rep.of_type("artifact")}
    assert set(artifacts) == {"corpus_train", "corpus_val"}
    for kind, name in (("corpus_train", "train.txt"), ("corpus_val", "val.txt")):
        on_disk = project.data_dir / name
        lines = file_lines(on_disk)
        assert artifacts[kind]["path"] == str(on_disk)
        assert artifacts[kind]["lines"] == len(lines)
        assert artifacts[kind]["empty"] == sum(1 for line in lines if line == "")
    # by hand: 560 train (int(28.0) = 28 empty), 40 val (max(1, 2) = 2 empty)
    assert (artifacts["corpus_train"]["lines"], artifacts["corpus_train"]["empty"]) == (560, 28)
    assert (artifacts["corpus_val"]["lines"], artifacts["corpus_val"]["empty"]) == (40, 2)
    assert project.corpus_files() == (project.data_dir / "train.txt", project.data_dir / "val.txt")
    assert corpus.__all__  # the module's public names are importable
    progress = rep.of_type("progress")
    assert progress[-1]["count"] == progress[-1]["total"] == 1


# ---------------------------------------------------------------- leftovers of a killed run

def test_temps_a_killed_write_left_in_data_are_removed_and_the_users_folder_is_not_touched(tmp_path, prompts600):
    path, _ = prompts600
    project = make_project(tmp_path / "p", [path])
    project.data_dir.mkdir()
    (project.data_dir / "images").mkdir()
    stale = [project.data_dir / ".train.txt.k3j2h1.tmp", project.data_dir / "images" / ".a.png.x9.tmp"]
    for f in stale:
        f.write_bytes(b"half a file")
    users = tmp_path / ".notes.txt.abc.tmp"          # beside the user's prompt file: not ours
    users.write_bytes(b"the user's")
    rep = ListReport()
    assert run(project, rep) == "done"
    assert not any(f.exists() for f in stale) and users.read_bytes() == b"the user's"
    assert any("removed 2 unfinished temporary" in e["message"] for e in rep.of_type("log"))
    assert len(file_lines(project.data_dir / "train.txt")) > 0
