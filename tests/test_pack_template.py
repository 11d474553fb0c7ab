"""The pack templates (docs/pack_templates/) are packs a contributor can ship on their own: each is installed as a
throwaway distribution outside the repo and the registry finds it through its `gguf_trainer.packs` entry point,
with no file of the repo edited. The T5 declaration runs end to end through the CLI to an export the engine would
run; the Qwen pack — its own teacher and make_shard, written from the seam alone — runs through the whole
conformance suite (tests/packs/test_conformance.py, unedited, limited to it by GGUF_TRAINER_CONFORMANCE)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO


def _git_state() -> str:
    """The repo's tracked and untracked changes (what a pack would have had to edit)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Both templates copied out of the repo and installed into one throwaway site folder."""
    top = tmp_path_factory.mktemp("templates")
    site = top / "site"
    for name in ("example_t5", "example_qwen"):
        source = shutil.copytree(REPO / "docs" / "pack_templates" / name, top / name)
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                              "--no-build-isolation", "--target", str(site), str(source)],
                             capture_output=True, text=True, timeout=300)
        assert pip.returncode == 0, pip.stderr[-2000:]
    return site


def _env(site) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def test_the_t5_template_installs_by_entry_point_and_exports_a_valid_adapter(site, tmp_path):
    before = _git_state()

    def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainer_core", *args], capture_output=True, text=True,
                              timeout=timeout, env=_env(site), cwd=tmp_path)

    listed = cli("packs")
    assert listed.returncode == 0 and "example_t5" in listed.stdout and "example_qwen" in listed.stdout
    without = subprocess.run([sys.executable, "-m", "trainer_core", "packs"], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert "example_t5" not in without.stdout          # found by its entry point, not by anything in the repo

    project = tmp_path / "projects" / "example"
    demo = cli("demo", "--pack", "example_t5", "--project", str(project))
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    run = cli("run", "--project", str(project), timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    exported = sorted(project.parent.glob("*-f16.gguf"))
    assert [p.name for p in exported] == ["pig_example-f16.gguf"]         # named after the project folder
    inspect = cli("inspect", str(exported[0]), "--json")
    info = json.loads(inspect.stdout)
    assert inspect.returncode == 0 and info["kind"] == "adapter" and info["variant"] == "seeded_resampler"
    assert info["problems"] == [] and info["kvs"]["adapter.pack"] == "example_t5"
    evaluation = json.loads((project / "eval.json").read_text())
    assert evaluation["pack"] == "example_t5" and evaluation["roundtrip_cos"] >= 0.999
    assert _git_state() == before


def test_the_conformance_suite_runs_for_a_pack_with_its_own_teacher_installed_from_outside(site, tmp_path):
    before = _git_state()
    env = {**_env(site), "GGUF_TRAINER_CONFORMANCE": "example_qwen"}
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST"):
        env.pop(var, None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                          "--basetemp", str(tmp_path / "suite"), str(REPO / "tests" / "packs" / "test_conformance.py"),
                          "-rA"], capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    passed = [line for line in run.stdout.splitlines() if line.startswith("PASSED") and "example_qwen" in line]
    names = {line.split("::")[-1].split("[")[0] for line in passed}
    assert {"test_the_demo_learns_and_evaluates_its_export", "test_inspect_accepts_the_adapter_and_every_file_beside_it",
            "test_infer_on_the_project_equals_the_numpy_engine", "test_batched_precompute_equals_one_sample_at_a_time",
            "test_the_teacher_equals_the_packs_reference_forward"} <= names, run.stdout[-3000:]
    assert "SKIPPED" not in run.stdout
    assert _git_state() == before
