"""Demo projects built and run once per test session, copied per test.

`trained(pack_id)` is a demo project taken through the whole pipeline in this process, through the
stages' own entry points chained as the driver chains them (corpus → precompute val → precompute
train, then train → export → eval): the in-process stage chain of every pack. `built(pack_id)` is the
same demo before its corpus stage. Both live in one folder per session that every xdist worker shares
(a file lock per pack: the first worker to need one builds it, the others wait and reuse it), and a
test gets its own copy (`copy_trained`, `copy_built`), so nothing one test does reaches another.

The runs use the demo's settings with `STEPS` training steps; tests/data/demo_hashes.json holds
bench/demo_hashes.py's fingerprints of the same runs made by `gguf-trainer run` in fresh processes,
and tests/test_demo_hashes.py checks that this chain writes the same bytes.
"""
from __future__ import annotations

import fcntl
import importlib
import os
import shutil
from pathlib import Path

import pytest

STEPS = 60
SETTINGS = (f"train.steps={STEPS}",)

_ROOT: Path | None = None


def _cache_root(factory: pytest.TempPathFactory) -> Path:
    """One folder for the whole session: the parent of the worker's own base under xdist."""
    base = factory.getbasetemp()
    top = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = top / "demo-cache"
    root.mkdir(exist_ok=True)
    return root


def configure(factory: pytest.TempPathFactory) -> None:
    global _ROOT
    _ROOT = _cache_root(factory)


def _env_of(root: Path) -> pytest.MonkeyPatch:
    """The environment a cached demo is built in: its own home, nothing of the user's or a test's."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(root / "home"))
    mp.setenv("GGUF_TRAINER_HOME", str(root / "home" / ".gguf-trainer"))
    mp.setenv("HF_HUB_OFFLINE", "1")
    for var in ("GGUF_TRAINER_MOCK_TEACHER", "GGUF_TRAINER_MATERIALS", "GGUF_TRAINER_RUN_ID"):
        mp.delenv(var, raising=False)
    return mp


def _folder_of(pack_id: str) -> str:
    from trainer_core.packs import get_pack
    return get_pack(pack_id).default_folder


def run_in_process(project_root: Path) -> None:
    """Every stage, chained in this process as the driver's stage processes chain them."""
    from trainer_core.base.events import ListReport
    from trainer_core.project import Project
    from trainer_core.stages import spec_of
    from trainer_core.stages.base import never, run_chain
    project = Project.open(project_root)
    for first, then in (("corpus", ["precompute_val", "precompute_train"]), ("train", ["export", "eval"])):
        spec = spec_of(first)
        report = ListReport()
        outcome = run_chain(spec.module, importlib.import_module(spec.module).run, project, report, never,
                            spec.kwargs, then)
        errors = report.of_type("error")
        assert outcome == "done" and not errors, f"{project_root.name}: {first} chain ended {outcome}: {errors}"


def _make(pack_id: str, what: str) -> Path:
    """The cached folder `<cache>/<what>-<pack>/` holding the project (and, once run, its export)."""
    assert _ROOT is not None, "demo_cache.configure() runs at session start (tests/conftest.py)"
    top = _ROOT / f"{what}-{pack_id}"
    project_root = top / _folder_of(pack_id)
    done = top / ".complete"
    with open(_ROOT / f"{what}-{pack_id}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            if top.exists():
                shutil.rmtree(top)              # a worker died half way: start again
            mp = _env_of(_ROOT)
            try:
                from trainer_core.demo.build import build_demo
                project = build_demo(project_root, pack_id)
                project.update_settings(list(SETTINGS))
                if what == "trained":
                    run_in_process(project_root)
            finally:
                mp.undo()
            done.touch()
    return project_root


def built(pack_id: str) -> Path:
    """The cached demo project of `pack_id`, built with SETTINGS and nothing run (do not modify it)."""
    return _make(pack_id, "built")


def trained(pack_id: str) -> Path:
    """The cached demo project of `pack_id` after the whole pipeline in process (do not modify it)."""
    return _make(pack_id, "trained")


def _copy(source: Path, where: Path) -> Path:
    """A copy of the cached folder (the project and what it exported beside it) under `where`."""
    where.mkdir(parents=True, exist_ok=True)
    top = Path(shutil.copytree(source.parent, where / source.parent.name, symlinks=True,
                               ignore=shutil.ignore_patterns(".complete")))
    return top / source.name


def copy_trained(pack_id: str, where: Path) -> Path:
    """A test's own copy of the trained demo of `pack_id`: the project folder's path."""
    return _copy(trained(pack_id), where)


def copy_built(pack_id: str, where: Path) -> Path:
    """A test's own copy of the built, not yet run demo of `pack_id`."""
    return _copy(built(pack_id), where)
