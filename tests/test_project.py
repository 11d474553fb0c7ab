"""Project folders: create/open, paths, the last project, settings updates, atomic writes."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from trainer_core.base import atomic
from trainer_core.base.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from trainer_core.base.errors import ConfigError, DiskFullError, NoProjectError, ProjectExistsError, UsageError
from trainer_core.project import Project, folder_is_project, last_project, remember_last_project

# the llada_image defaults, written out (peer-behaviour §2.1, the keys the project file must hold)
LLADA_TRAIN = {
    "device": "auto", "width": 1024, "depth": 6, "steps": 20000, "batch_size": 32, "lr": 2e-4,
    "warmup": 1000, "weight_decay": 0.01, "grad_clip": 1.0, "cos_weight": 0.5, "sigma_floor": 0.03,
    "grad_checkpoint": "auto", "log_every": 25, "val_every": 500, "save_every": 250,
    "history": False, "history_every": 500, "history_from": 0, "history_to": 0, "history_keep": 0,
    "seed": 42,
}
# a project.json holds the common settings and its own pack's (LLaDA's export_sigvq), not Ming's vision ones
LLADA_EXPORT = {"output_dir": "", "copy_to": "", "export_sigvq": True, "run_eval": True}
LLADA_CORPUS_SOME = {
    "mode": "presets", "presets": ["gustavosta", "midjourney"], "n_train": 60000, "n_val": 1024,
    "min_chars": 8, "max_chars": 1200, "seed": 8, "empty_frac": 0.01,
}
LLADA_PRECOMPUTE_SOME = {
    "device": "auto", "placement": "sequential", "shard_size": 1024, "val_shard_size": 512,
    "teacher_batch": 24, "tok_budget": 12288, "student_batch": 64, "student_dtype": "bf16",
}


def _keys_sorted(obj) -> bool:
    """True when every JSON object in obj (parsed with key order kept) has sorted keys."""
    if isinstance(obj, list) and obj and isinstance(obj[0], tuple):
        keys = [k for k, _ in obj]
        return keys == sorted(keys) and all(_keys_sorted(v) for _, v in obj)
    if isinstance(obj, list):
        return all(_keys_sorted(v) for v in obj)
    return True


def _entries(folder: Path) -> list[str]:
    """The folder's entries, less the project's lock files (.settings.lock, .run.lock)."""
    return sorted(p.name for p in folder.iterdir() if not (p.name.startswith(".") and p.name.endswith(".lock")))


def _settings_file(_unused: Path | None = None) -> Path:
    return Path(os.environ["GGUF_TRAINER_HOME"]) / "settings.json"


# ---------------------------------------------------------------- create

def test_create_writes_project_and_state(tmp_path):
    root = tmp_path / "llada_adapter"
    project = Project.create(root, "llada_image")
    assert project.root == root.resolve()
    assert _entries(root) == ["project.json", "state.json"]
    assert folder_is_project(root)

    text = (root / "project.json").read_text(encoding="utf-8")
    assert text.startswith("{\n  \"")           # pretty: indented
    assert text.endswith("}\n")
    assert _keys_sorted(json.loads(text, object_pairs_hook=list))
    data = json.loads(text)
    assert data["pack"] == "llada_image"
    assert data["name"] == "pig_llada_adapter"
    assert data["auto_resume"] is True
    assert "hf_token" not in data                # a secret: kept in .hf_token, never in project.json
    assert data["materials"] == {}
    assert data["train"] == {**data["train"], **LLADA_TRAIN}
    assert {k: data["train"][k] for k in LLADA_TRAIN} == LLADA_TRAIN
    assert data["export"] == LLADA_EXPORT
    assert {k: data["corpus"][k] for k in LLADA_CORPUS_SOME} == LLADA_CORPUS_SOME
    assert {k: data["precompute"][k] for k in LLADA_PRECOMPUTE_SOME} == LLADA_PRECOMPUTE_SOME

    state = json.loads((root / "state.json").read_text(encoding="utf-8"))
    assert state["status"] == "idle"
    assert state["stage"] is None
    assert state["stages"] == {}
    assert state["error"] is None
    assert project.read_state()["status"] == "idle"

    assert project.settings.name == "pig_llada_adapter"
    assert Project.open(root).settings == project.settings


def test_create_makes_missing_parents(tmp_path):
    root = tmp_path / "a" / "b" / "t5_adapter"
    project = Project.create(root, "t5xxl_pixart")
    assert (root / "project.json").is_file()
    data = json.loads((root / "project.json").read_text())
    assert data["pack"] == "t5xxl_pixart"
    assert data["name"] == "pig_t5_adapter"
    assert data["corpus"]["n_train"] == 120000
    assert project.settings.corpus.n_val == 2048


@pytest.mark.parametrize(
    "folder, expected",
    [
        ("llada_adapter", "pig_llada_adapter"),
        ("pig_x", "pig_x"),
        ("my adapter", "pig_my_adapter"),
        ("my  big adapter!", "pig_my_big_adapter"),
        ("v1.2-test", "pig_v1.2-test"),
    ],
)
def test_create_derives_name_from_folder(tmp_path, folder, expected):
    project = Project.create(tmp_path / folder, "llada_image")
    assert project.settings.name == expected
    assert json.loads((tmp_path / folder / "project.json").read_text())["name"] == expected
    # and it is a valid name: the project opens
    assert Project.open(tmp_path / folder).settings.name == expected


def test_create_with_explicit_name(tmp_path):
    project = Project.create(tmp_path / "somewhere", "llada_image", name="custom.adapter-1")
    assert project.settings.name == "custom.adapter-1"


@pytest.mark.parametrize("bad", ["a/b", "", "-x", "has space"])
def test_create_with_invalid_name_creates_nothing(tmp_path, bad):
    root = tmp_path / "new_project"
    with pytest.raises(ConfigError) as info:
        Project.create(root, "llada_image", name=bad)
    assert any(p.startswith("name ") for p in info.value.problems)
    assert not root.exists()
    assert last_project() is None


def test_create_unknown_pack_creates_nothing(tmp_path):
    root = tmp_path / "new_project"
    with pytest.raises(UsageError):
        Project.create(root, "no_such_pack")
    assert not root.exists()


def test_create_refuses_existing_project(tmp_path):
    root = tmp_path / "llada_adapter"
    Project.create(root, "llada_image")
    before = (root / "project.json").read_bytes()
    mtime = (root / "project.json").stat().st_mtime_ns
    with pytest.raises(ProjectExistsError) as info:
        Project.create(root, "t5xxl_pixart")
    assert "llada_image" in str(info.value)
    assert (root / "project.json").read_bytes() == before
    assert (root / "project.json").stat().st_mtime_ns == mtime


def test_create_in_existing_empty_folder(tmp_path):
    root = tmp_path / "existing"
    root.mkdir()
    (root / "notes.txt").write_text("keep me")
    Project.create(root, "llada_image")
    assert (root / "notes.txt").read_text() == "keep me"
    assert folder_is_project(root)


def test_create_on_a_file_is_refused(tmp_path):
    target = tmp_path / "afile"
    target.write_text("x")
    with pytest.raises(NoProjectError):
        Project.create(target, "llada_image")
    assert target.read_text() == "x"


# ---------------------------------------------------------------- open

def test_open_missing_folder(tmp_path):
    with pytest.raises(NoProjectError) as info:
        Project.open(tmp_path / "nope")
    assert "does not exist" in str(info.value)


def test_open_folder_without_project_json(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoProjectError) as info:
        Project.open(tmp_path / "empty")
    assert "project.json" in str(info.value)


def test_open_invalid_json_names_file_and_line(tmp_path):
    root = tmp_path / "p"
    Project.create(root, "llada_image")
    (root / "project.json").write_text('{\n  "train": {\n    "steps": 5,\n  }\n}\n')
    with pytest.raises(ConfigError) as info:
        Project.open(root)
    msg = str(info.value)
    assert str(root.resolve() / "project.json") in msg
    assert "line 4" in msg


def test_open_not_utf8(tmp_path):
    root = tmp_path / "p"
    Project.create(root, "llada_image")
    (root / "project.json").write_bytes(b'{"name": "\xff\xfe"}')
    with pytest.raises(ConfigError) as info:
        Project.open(root)
    assert "project.json" in str(info.value)


def test_open_invalid_settings_names_file_and_key(tmp_path):
    root = tmp_path / "p"
    Project.create(root, "llada_image")
    (root / "project.json").write_text(json.dumps({"train": {"steps": "abc", "lr": -1}}))
    with pytest.raises(ConfigError) as info:
        Project.open(root)
    path = str(root.resolve() / "project.json")
    problems = info.value.problems
    assert len(problems) == 2
    assert f'{path}: train.steps must be a positive whole number, got "abc"' in problems
    assert all(p.startswith(path + ": ") for p in problems)
    assert any("train.lr" in p for p in problems)


def test_open_partial_file_gets_pack_defaults(tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    (root / "project.json").write_text(json.dumps({"pack": "qwen3vl_mageflow", "train": {"steps": 99}}))
    s = Project.open(root).settings
    assert s.train.steps == 99
    assert s.train.depth == 4
    assert s.precompute.shard_size == 512
    assert s.name == "pig_qwen3vl_4b_adapter"


# ---------------------------------------------------------------- paths

def test_output_dir_defaults_to_parent(tmp_path):
    root = tmp_path / "work" / "llada_adapter"
    project = Project.create(root, "llada_image")
    parent = (tmp_path / "work").resolve()
    assert project.output_dir() == parent
    assert project.gguf_path() == parent / "pig_llada_adapter-f16.gguf"
    assert project.gguf_path(step=500) == parent / "pig_llada_adapter-step500-f16.gguf"
    assert project.gguf_path(step=0) == parent / "pig_llada_adapter-step0-f16.gguf"


def test_relative_output_dir_resolves_against_project(tmp_path):
    root = tmp_path / "work" / "llada_adapter"
    project = Project.create(root, "llada_image")
    project.update_settings(["export.output_dir=exports/gguf"])
    assert project.output_dir() == root.resolve() / "exports" / "gguf"
    assert project.gguf_path() == root.resolve() / "exports" / "gguf" / "pig_llada_adapter-f16.gguf"
    project.update_settings(["export.output_dir=../shared"])
    assert project.output_dir() == (tmp_path / "work" / "shared").resolve()


def test_absolute_output_dir(tmp_path):
    project = Project.create(tmp_path / "p", "llada_image")
    target = tmp_path / "elsewhere"
    project.update_settings([f"export.output_dir={target}"])
    assert project.output_dir() == target
    assert project.gguf_path(step=7) == target / "pig_p-step7-f16.gguf"


def test_tilde_output_dir_expands(tmp_path, isolated_env):
    project = Project.create(tmp_path / "p", "llada_image")
    project.update_settings(["export.output_dir=~/ggufs"])
    assert project.output_dir() == Path(isolated_env) / "ggufs"
    assert "~" not in str(project.gguf_path())


def test_corpus_files_presets_mode(tmp_path):
    project = Project.create(tmp_path / "p", "llada_image")
    root = (tmp_path / "p").resolve()
    assert project.corpus_files() == (root / "data" / "train.txt", root / "data" / "val.txt")


def test_corpus_files_files_mode(tmp_path):
    project = Project.create(tmp_path / "p", "t5xxl_pixart")
    root = (tmp_path / "p").resolve()
    abs_val = tmp_path / "elsewhere" / "val.txt"
    project.update_settings(["corpus.mode=files", "corpus.train_file=mine/train.txt",
                             f"corpus.val_file={abs_val}"])
    assert project.corpus_files() == (root / "mine" / "train.txt", abs_val)
    project.update_settings(["corpus.train_file=../shared/train.txt"])
    assert project.corpus_files()[0] == (tmp_path / "shared" / "train.txt").resolve()


@pytest.mark.parametrize("pack_id", ["qwen3vl_mageflow", "qwen3vl_qwenimage"])
def test_corpus_files_image_pack(tmp_path, pack_id):
    project = Project.create(tmp_path / "p", pack_id)
    root = (tmp_path / "p").resolve()
    assert project.corpus_files() == (root / "data" / "train.jsonl", root / "data" / "val.jsonl")


# ---------------------------------------------------------------- last project

def test_last_project_is_none_at_first():
    assert last_project() is None


def test_remember_last_project_round_trip(tmp_path):
    target = tmp_path / "some" / "project"
    remember_last_project(target)
    assert last_project() == target.resolve()
    settings = _settings_file(tmp_path)
    assert settings.is_file()
    assert json.loads(settings.read_text())["last_project"] == str(target.resolve())
    other = tmp_path / "other"
    remember_last_project(other)
    assert last_project() == other.resolve()


def test_remember_keeps_other_user_settings(tmp_path):
    settings = _settings_file(tmp_path)
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"theme": "dark"}))
    remember_last_project(tmp_path / "x")
    data = json.loads(settings.read_text())
    assert data == {"theme": "dark", "last_project": str((tmp_path / "x").resolve())}


def test_remember_repairs_corrupt_settings(tmp_path):
    settings = _settings_file(tmp_path)
    settings.parent.mkdir(parents=True)
    settings.write_text("{not json")
    assert last_project() is None
    remember_last_project(tmp_path / "x")
    assert last_project() == (tmp_path / "x").resolve()


def test_create_remembers_project(tmp_path):
    root = tmp_path / "llada_adapter"
    Project.create(root, "llada_image")
    assert last_project() == root.resolve()
    assert json.loads(_settings_file(tmp_path).read_text())["last_project"] == str(root.resolve())


# ---------------------------------------------------------------- update_settings

def test_update_settings_returns_before_and_after(tmp_path):
    root = tmp_path / "p"
    project = Project.create(root, "llada_image")
    before, after = project.update_settings(["train.steps=12k"])
    assert before.train.steps == 20000
    assert after.train.steps == 12000
    assert project.settings.train.steps == 12000
    data = json.loads((root / "project.json").read_text())
    assert data["train"]["steps"] == 12000   # stored parsed, not as "12k"
    assert Project.open(root).settings.train.steps == 12000
    # other settings untouched
    assert data["train"]["depth"] == 6
    assert data["name"] == "pig_p"


def test_update_settings_sees_changes_made_by_others(tmp_path):
    root = tmp_path / "p"
    a = Project.create(root, "llada_image")
    b = Project.open(root)
    a.update_settings(["train.steps=500"])
    b.update_settings(["train.depth=3"])
    s = Project.open(root).settings
    assert s.train.steps == 500
    assert s.train.depth == 3


@pytest.mark.parametrize("assignments", [
    ["train.steps=abc"],
    ["train.steps=12k", "train.stesp=5"],
    ["train.steps=12k", "no_equals_sign"],
    ["corpus.min_chars=5000"],
])
def test_update_settings_invalid_leaves_file_untouched(tmp_path, assignments):
    root = tmp_path / "p"
    project = Project.create(root, "llada_image")
    path = root / "project.json"
    before_bytes = path.read_bytes()
    before_mtime = path.stat().st_mtime_ns
    with pytest.raises(ConfigError):
        project.update_settings(assignments)
    assert path.read_bytes() == before_bytes
    assert path.stat().st_mtime_ns == before_mtime
    assert not [p.name for p in root.iterdir() if p.name.endswith(".tmp")]


# ---------------------------------------------------------------- atomic writes

def test_no_temp_files_after_several_writes(tmp_path):
    root = tmp_path / "p"
    project = Project.create(root, "llada_image")
    for i in range(3):
        project.update_settings([f"train.steps={1000 + i}"])
        state = project.read_state()
        state["status"] = f"s{i}"
        project.write_state(state)
    for i in range(5):
        atomic_write_json(root / "extra.json", {"i": i})
        atomic_write_text(root / "notes.txt", f"note {i}")
    assert not [p.name for p in root.iterdir() if p.name.endswith(".tmp")]
    assert _entries(root) == ["extra.json", "notes.txt", "project.json", "state.json"]
    assert json.loads((root / "extra.json").read_text()) == {"i": 4}
    assert (root / "notes.txt").read_text() == "note 4"
    assert project.read_state()["status"] == "s2"
    assert Project.open(root).settings.train.steps == 1002


def test_atomic_write_json_format(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"b": 1, "a": {"d": [1, 2], "c": "é"}})
    assert path.read_text(encoding="utf-8") == (
        '{\n  "a": {\n    "c": "é",\n    "d": [\n      1,\n      2\n    ]\n  },\n  "b": 1\n}\n'
    )


def test_atomic_write_into_missing_folder(tmp_path):
    path = tmp_path / "a" / "b" / "c" / "file.bin"
    atomic_write_bytes(path, b"\x00\x01payload")
    assert path.read_bytes() == b"\x00\x01payload"
    assert sorted(p.name for p in path.parent.iterdir()) == ["file.bin"]


def test_atomic_write_replaces_and_keeps_mode(tmp_path):
    path = tmp_path / "secret.json"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_failed_replace_keeps_original_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "data.json"
    path.write_bytes(b'{"original": true}\n')

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(DiskFullError, match="No space left on .* while writing data.json"):
        atomic_write_json(path, {"original": False})
    monkeypatch.undo()
    assert path.read_bytes() == b'{"original": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]


def test_failed_write_keeps_original_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "data.bin"
    path.write_bytes(b"original")

    def boom(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic.os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(path, b"replacement")
    monkeypatch.undo()
    assert path.read_bytes() == b"original"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]


def test_failed_save_settings_keeps_project_json(tmp_path, monkeypatch):
    root = tmp_path / "p"
    project = Project.create(root, "llada_image")
    before = (root / "project.json").read_bytes()

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(DiskFullError, match="project.json"):
        project.update_settings(["train.steps=5"])
    monkeypatch.undo()
    assert (root / "project.json").read_bytes() == before
    assert not [p.name for p in root.iterdir() if p.name.endswith(".tmp")]
    assert Project.open(root).settings.train.steps == 20000


@pytest.mark.parametrize("content", [None, "not json", "[1, 2]"])
def test_read_json_default(tmp_path, content):
    path = tmp_path / "f.json"
    if content is not None:
        path.write_text(content)
    expected = [1, 2] if content == "[1, 2]" else "DEFAULT"
    assert read_json(path, "DEFAULT") == expected
