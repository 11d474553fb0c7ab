"""The pack template (docs/pack_template/) is a pack a contributor can ship on its own: installed as a
throwaway distribution outside the repo, the registry finds it through its `gguf_trainer.packs` entry
point, and its demo runs end to end through the CLI to an export the engine would run — with no
file of the repo edited."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from conftest import REPO


def _git_state() -> str:
    """The repo's tracked and untracked changes (what a pack would have had to edit)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


def test_a_pack_from_the_template_installs_by_entry_point_and_exports_a_valid_adapter(tmp_path):
    before = _git_state()
    source = tmp_path / "my_pack"
    shutil.copytree(REPO / "docs" / "pack_template", source)
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                          "--no-build-isolation", "--target", str(site), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    assert (site / "example_t5_pack").is_dir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}

    def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainer_core", *args], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=tmp_path)

    listed = cli("packs")
    assert listed.returncode == 0 and "example_t5" in listed.stdout
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
