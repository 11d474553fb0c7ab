"""Shared fixtures: an isolated environment, a CLI runner, prompt files."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import demo_cache

REPO = Path(__file__).resolve().parent.parent

# A machine told not to write bytecode (PYTHONDONTWRITEBYTECODE, set on the CI machines here) makes every process
# a test starts compile the trainer's ~30k lines again, and each worker re-rewrite every test module: a
# `gguf-trainer status` took 0.83 CPU-s instead of 0.41, importing the train stage 2.8 instead of 2.4, collecting
# the suite 19.5 instead of 10.2 (measured side by side). The suite's processes write it, as Python does by default
# (atomically: two workers may write one file at once).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# A shell without job control starts a background job (`bash .ci/run &`) with SIGINT ignored, and every process a
# test starts would inherit that: the command under test would never see the Ctrl-C a test sends it
# (test_materials' Ctrl-C test waited out its 60 s). The suite's processes take SIGINT as a terminal gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# huggingface_hub and datasets read HF_HUB_OFFLINE once, when first imported — which may happen while
# test modules are collected, before any fixture runs. Offline from the start, then; the tests that
# talk to the loopback Hub switch huggingface_hub's constant on for themselves.
os.environ["HF_HUB_OFFLINE"] = "1"
# Two xdist workers and the processes they start share two cores: an OpenMP thread that spins while it
# waits for work (the default) burns the core another process needs — one GUI test took 144 s beside an
# in-process demo build instead of 24 s. Passive waiting changes no result (the thread counts stay).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session", autouse=True)
def _demo_cache(tmp_path_factory):
    """The session's shared demo projects (tests/demo_cache.py) live under its base temp folder."""
    demo_cache.configure(tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def _one_thread_per_process():
    """Two workers share the machine's cores, so a process a test (or a module's fixture) starts computes with one
    torch thread: at torch's default (a thread per core) a demo's train chain took 10.9 CPU-s instead of 5.3 beside
    the other worker, measured side by side. The demo runs whose exports are held to recorded bytes keep the
    machine's count (tests/demo_cache.py): the thread count changes the order of the sums, and with it the bytes."""
    mp = pytest.MonkeyPatch()
    mp.setenv("OMP_NUM_THREADS", "1")
    yield
    mp.undo()


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread_per_module():
    _one_torch_thread()


def _one_torch_thread() -> None:
    """This worker computes with one torch thread too (the other worker has the other core), so what a test runs
    in-process and what its processes run sum in the same order. Set again for every module and test: code under
    test may change it (a CPU teacher takes every core). The demo builds that the recorded exports start from go
    back to the machine's count while they run (demo_cache.machine_threads)."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory, monkeypatch):
    """No test sees the user's home, settings or Hub token."""
    _one_torch_thread()
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(home / ".gguf-trainer"))
    # what the trainer caches to save time (the offline demo's Qwen tokenizer) is shared by the whole session
    monkeypatch.setenv("GGUF_TRAINER_CACHE", str(demo_cache.shared_cache()))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "GGUF_TRAINER_MATERIALS",
                "GGUF_TRAINER_MOCK_TEACHER", "GGUF_TRAINER_LOCK_FD", "GGUF_TRAINER_RUN_ID", "GGUF_TRAINER_PARENT_PID"):
        monkeypatch.delenv(var, raising=False)
    # the Hugging Face token store's file (`hf auth login`): HF_TOKEN_PATH for child processes; huggingface_hub
    # read it once, at import, in this one
    hf_token_path = str(home / ".cache" / "huggingface" / "token")
    monkeypatch.setenv("HF_TOKEN_PATH", hf_token_path)
    import huggingface_hub.constants as hf_constants
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", hf_token_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test(request):
    """A run a test started (detached, in its own session: the pipeline driver, its stages) ends with the
    test, passed or failed: a failed browser test once left a 100 000-step training on one of the two cores
    for the rest of the suite, and every timing after it failed. Such processes name the test's folder in
    their command line."""
    # asked for here, the test's folder is torn down after this fixture's end, not before it
    folder = str(request.getfixturevalue("tmp_path")) if "tmp_path" in request.fixturenames else None
    yield
    if folder is None:
        return
    import psutil
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid != os.getpid() and any(folder in arg for arg in proc.info["cmdline"] or ()):
                left.append(proc)
        except (psutil.Error, TypeError):
            continue
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)


# Commands that read or write project files and leave nothing behind in the process: cli() runs them here, through
# the command's own entry point (cli_here), instead of in an interpreter that imports the trainer again (~0.4 CPU-s
# each, ~200 of them a run). The rest — run, start, stop, demo, snapshot… — and any call given a cwd get a fresh
# process, as a user's shell gives them; tests of the process itself (exit codes through a pipe, what a command
# imports) start their own.
IN_PROCESS = frozenset({"new", "set", "status", "inspect", "packs", "reset", "infer"})


def cli(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`gguf-trainer ARGS`: in this process for the commands in IN_PROCESS, else (as `python -m trainer_core`) in a
    fresh one."""
    if cwd is None and args and args[0] in IN_PROCESS:
        return cli_here(*args)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "trainer_core", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)


def cli_here(*args: str) -> subprocess.CompletedProcess:
    """`gguf-trainer ARGS` through the command's own entry point in this process: what cli() returns, without an
    interpreter and torch to start (for a command that leaves no process state behind, such as infer)."""
    import contextlib
    import io

    from trainer_core.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["gguf-trainer", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture
def run_cli():
    return cli


def demo_with_corpus(root: Path, pack_id: str = "t5xxl_pixart", settings: tuple[str, ...] = ()) -> Path:
    """`build_demo` at `root`, `settings` applied, its corpus stage run; returns the folder (a
    template that tests copy with `copy_project`)."""
    from trainer_core.demo import build_demo
    from trainer_core.base.events import ListReport
    from trainer_core.project import Project
    from trainer_core.stages import corpus
    project = build_demo(root, pack_id)
    if settings:
        project.update_settings(list(settings))
    assert corpus.run(Project.open(root), ListReport()) == "done"
    return root


def copy_project(template: Path, where: Path):
    """A copy of a template project folder under `where`, opened."""
    import shutil

    from trainer_core.project import Project
    return Project.open(shutil.copytree(template, where / template.name))


def trained_demo(root: Path, pack_id: str = "t5xxl_pixart") -> Path:
    """`gguf-trainer demo --pack PACK` + `gguf-trainer run`: the whole pipeline, in fresh processes."""
    assert cli("demo", "--project", str(root), "--pack", pack_id).returncode == 0
    r = cli("run", "--project", str(root), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return root


def write_prompts(path: Path, n: int, seed: int = 0) -> list[str]:
    """n distinct prompts of 3-12 words, one a line; returns them."""
    rng = random.Random(seed)
    words = ("cat dog sheep sunglasses portrait lady castle forest neon city night sunset river "
             "mountain cyberpunk watercolor oil painting glass bridge storm lantern desert robot").split()
    prompts: list[str] = []
    seen: set[str] = set()
    while len(prompts) < n:
        text = f"{len(prompts)} " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        if text.lower() not in seen:
            seen.add(text.lower())
            prompts.append(text)
    path.write_text("".join(p + "\n" for p in prompts), encoding="utf-8")
    return prompts


@pytest.fixture
def text_project(tmp_path, run_cli):
    """A llada_image project whose corpus is one local file of 600 prompts, n_val 40."""
    root = tmp_path / "work" / "llada_adapter"
    prompts = tmp_path / "prompts.txt"
    write_prompts(prompts, 600)
    r = run_cli("new", "--project", str(root), "--pack", "llada_image")
    assert r.returncode == 0, r.stderr
    r = run_cli("set", "--project", str(root), "--set", "corpus.presets=[]",
                "--set", f"corpus.extra_files={prompts}", "--set", "corpus.n_val=40")
    assert r.returncode == 0, r.stderr
    return root
