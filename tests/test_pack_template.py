"""The pack templates (docs/pack_templates/) are packs a contributor can ship on their own: each is installed as a
throwaway distribution outside the repo and the registry finds it through its `gguf_trainer.packs` entry point,
with no file of the repo edited. Both run through the whole conformance suite (tests/packs/test_conformance.py,
unedited, limited to them by GGUF_TRAINER_CONFORMANCE) in one process of their own: the T5 declaration, and the
Qwen pack with its own teacher and make_shard, written from the seam alone."""
from __future__ import annotations

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


def test_both_templates_install_by_entry_point_and_pass_the_conformance_suite(site, tmp_path):
    before = _git_state()
    listed = subprocess.run([sys.executable, "-m", "trainer_core", "packs"], capture_output=True, text=True,
                            env=_env(site), cwd=tmp_path)
    assert listed.returncode == 0 and "example_t5" in listed.stdout and "example_qwen" in listed.stdout
    without = subprocess.run([sys.executable, "-m", "trainer_core", "packs"], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert without.returncode == 0 and "example_t5" not in without.stdout    # found by its entry point alone

    env = {**_env(site), "GGUF_TRAINER_CONFORMANCE": "example_t5,example_qwen"}
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST"):
        env.pop(var, None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                          "--basetemp", str(tmp_path / "suite"), str(REPO / "tests" / "packs" / "test_conformance.py"),
                          "-rA"], capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "SKIPPED" not in run.stdout
    shared = {"test_the_demo_learns_and_evaluates_its_export", "test_inspect_accepts_the_adapter_and_every_file_beside_it",
              "test_infer_on_the_project_equals_the_numpy_engine", "test_batched_precompute_equals_one_sample_at_a_time",
              "test_the_default_plan_is_within_its_bounds_of_the_demo_run", "test_the_demo_exports_the_recorded_bytes"}
    for pack_id, own in (("example_t5", set()), ("example_qwen", {"test_the_teacher_equals_the_packs_reference_forward"})):
        passed = [line for line in run.stdout.splitlines() if line.startswith("PASSED") and f"[{pack_id}]" in line]
        names = {line.split("::")[-1].split("[")[0] for line in passed}
        assert shared | own <= names, (pack_id, run.stdout[-3000:])
    # the T5 declaration's export as a user gets it: named after its project folder, its pack in its KVs
    project = next((tmp_path / "suite").glob("demo-cache/trained-example_t5/*/project.json")).parent
    exported = sorted(project.parent.glob("*-f16.gguf"))
    assert [p.name for p in exported] == [f"pig_{project.name}-f16.gguf"]
    assert _git_state() == before
