"""Demo projects built and run once per test session, copied per test.

`trained(pack_id)` is a demo project taken through the whole pipeline by the stages' own entry points, one
process per chain as the driver starts them (`python -m trainer_core.stages.corpus --then precompute_val
precompute_train`, then `… stages.train --then export eval`), so what the run took is what a user's run takes:
`run_figures(pack_id)` has each process's wall time, CPU time, run delay and peak RSS (procs.wait_usage) and
the bytes the run wrote (tests/test_plan.py sets the default plan beside them). `built(pack_id)` is the same
demo before its corpus stage; a trained demo is a copy of it, run. Both live in one folder per session that every xdist worker shares
(a file lock per pack: the first worker to need one builds it, the others wait and reuse it), and a test gets
its own copy (`copy_trained`, `copy_built`), so nothing one test does reaches another.

The runs use the demo's settings with `STEPS` training steps; tests/data/demo_hashes.json holds
bench/demo_hashes.py's fingerprints of the same runs made by `gguf-trainer run`, and
tests/test_demo_hashes.py checks that these processes write the same bytes.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

STEPS = 60
SETTINGS = (f"train.steps={STEPS}",)

_ROOT: Path | None = None
# the machine's own thread settings, before the suite gives each test's processes, and this one, one thread
# (tests/conftest.py)
_MACHINE_THREADS = os.environ.get("OMP_NUM_THREADS")
_MACHINE_TORCH_THREADS = torch.get_num_threads()


@contextmanager
def machine_threads():
    """This process computes with the machine's own torch thread count inside."""
    threads = torch.get_num_threads()
    torch.set_num_threads(_MACHINE_TORCH_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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


def shared_cache() -> Path:
    """The session's GGUF_TRAINER_CACHE (base/folder.cache_dir): what any test or process caches is built once."""
    assert _ROOT is not None, "demo_cache.configure() runs at session start (tests/conftest.py)"
    return _ROOT.parent / "trainer-cache"


def _env_of(root: Path) -> pytest.MonkeyPatch:
    """The environment a cached demo is built in: its own home, nothing of the user's or a test's."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(root / "home"))
    mp.setenv("GGUF_TRAINER_HOME", str(root / "home" / ".gguf-trainer"))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("GGUF_TRAINER_CACHE", str(shared_cache()))
    if _MACHINE_THREADS is None:            # torch's default, as the recorded runs (tests/data/demo_hashes.json) had
        mp.delenv("OMP_NUM_THREADS", raising=False)
    else:
        mp.setenv("OMP_NUM_THREADS", _MACHINE_THREADS)
    for var in ("GGUF_TRAINER_MOCK_TEACHER", "GGUF_TRAINER_MATERIALS", "GGUF_TRAINER_RUN_ID"):
        mp.delenv(var, raising=False)
    return mp


def _folder_of(pack_id: str) -> str:
    from trainer_core.packs import get_pack
    return get_pack(pack_id).default_folder


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def stage_chains() -> list[list[Any]]:
    """The stages (StageSpecs) in the processes the driver starts for a whole run: each list runs in one process,
    its first stage started with `--then` the others."""
    from trainer_core.stages import STAGES
    chains: list[list[Any]] = [[]]
    for spec in STAGES:
        chains[-1].append(spec)
        if not spec.chains:
            chains.append([])
    return [c for c in chains if c]


def run_processes(project_root: Path, log: Path) -> list[dict[str, Any]]:
    """Every stage, one process per chain started as the driver starts it (its command line, the project
    folder as cwd, events on stdout, appended to `log`); per process its stages, wall seconds, CPU seconds, the
    seconds its main thread and all its threads sat ready but without a core, and peak RSS (procs.Usage)."""
    from trainer_core.base.events import parse_event
    from trainer_core.base.procs import wait_usage
    from trainer_core.runner import child_env
    env = child_env()
    for var in ("GGUF_TRAINER_PARENT_PID", "GGUF_TRAINER_LOCK_FD", "GGUF_TRAINER_RUN_ID"):   # no driver here
        env.pop(var, None)
    figures = []
    for first, *then in stage_chains():
        argv = [sys.executable, "-m", first.module, "--project", str(project_root), *first.args]
        argv += ["--then", *(spec.name for spec in then)] if then else []
        started = time.monotonic()
        with open(log, "ab") as out, open(log.with_suffix(".stderr"), "wb") as err:     # a pipe could fill
            proc = subprocess.Popen(argv, cwd=project_root, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=env)
            usage = wait_usage(proc)           # its own peak: ru_maxrss would carry this worker's 0.6 GB
        seconds = time.monotonic() - started
        stderr = log.with_suffix(".stderr").read_text(encoding="utf-8", errors="replace")
        events = [parse_event(line) for line in log.read_text(encoding="utf-8").splitlines()]
        errors = [e["payload"] for e in events if e is not None and e["type"] == "error"]
        assert proc.returncode == 0 and not errors, \
            f"{project_root.name}: {first.name} chain failed: {errors} {stderr[-3000:]}"
        figures.append({"stages": [first.name, *(spec.name for spec in then)], "seconds": seconds,
                        "cpu_seconds": usage.cpu_seconds, "queued_seconds": usage.queued_seconds,
                        "queued_all_seconds": usage.queued_all_seconds, "peak_rss_bytes": usage.peak_rss_bytes})
    return figures


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
                if what == "trained":
                    source = built(pack_id)
                    shutil.copytree(source.parent, top, symlinks=True, ignore=shutil.ignore_patterns(".complete"))
                    before = _tree_bytes(top)
                    log = _ROOT / f"{what}-{pack_id}.events.jsonl"
                    log.unlink(missing_ok=True)
                    chains = run_processes(project_root, log)
                    figures = {"processes": chains, "seconds": sum(c["seconds"] for c in chains),
                               "peak_rss_bytes": max(c["peak_rss_bytes"] for c in chains),
                               "written_bytes": _tree_bytes(top) - before}
                    (_ROOT / f"{what}-{pack_id}.run.json").write_text(json.dumps(figures), encoding="utf-8")
                else:
                    from trainer_core.demo import build_demo
                    with machine_threads():
                        project = build_demo(project_root, pack_id)
                    project.update_settings(list(SETTINGS))
            finally:
                mp.undo()
            done.touch()
    return project_root


def built(pack_id: str) -> Path:
    """The cached demo project of `pack_id`, built with SETTINGS and nothing run (do not modify it)."""
    return _make(pack_id, "built")


def trained(pack_id: str) -> Path:
    """The cached demo project of `pack_id` after the whole pipeline (do not modify it)."""
    return _make(pack_id, "trained")


def run_figures(pack_id: str) -> dict[str, Any]:
    """What the trained demo's run took: {"processes": [{"stages", "seconds", "cpu_seconds", "queued_seconds",
    "queued_all_seconds", "peak_rss_bytes"}] (run_processes), "seconds" (their wall seconds summed: the driver's
    own start is not in it), "peak_rss_bytes" (the largest process), "written_bytes" (what the run left in the
    project folder and the output folder beside it)}."""
    trained(pack_id)
    assert _ROOT is not None
    return json.loads((_ROOT / f"trained-{pack_id}.run.json").read_text(encoding="utf-8"))


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
