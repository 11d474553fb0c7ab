"""trainer_core never imports gradio: it must import and work with gradio unimportable."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO

BLOCK_GRADIO = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gradio" or name.startswith("gradio."):
            raise ImportError("gradio is blocked in this test")
sys.meta_path.insert(0, Block())
"""


def run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_GRADIO + code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_blocker_really_blocks_gradio():
    r = run_blocked("import gradio")
    assert r.returncode != 0 and "gradio is blocked" in r.stderr


def test_core_imports_without_gradio():
    r = run_blocked(
        "import pkgutil, trainer_core, trainer_core.cli, trainer_core.pipeline\n"
        "names = [m.name for m in pkgutil.walk_packages(trainer_core.__path__, 'trainer_core.')]\n"
        "names = [n for n in names if n != 'trainer_core.__main__']\n"
        "for n in names: __import__(n)\n"
        "assert 'gradio' not in sys.modules\n"
        "print(len(names))\n")
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) >= 10


def test_cli_works_without_gradio(tmp_path):
    r = run_blocked(
        "from trainer_core.cli import main\n"
        f"assert main(['new', '--project', {str(tmp_path / 'p')!r}, '--pack', 't5xxl_pixart']) == 0\n"
        f"assert main(['status', '--project', {str(tmp_path / 'p')!r}]) == 0\n")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p" / "project.json").is_file()


def test_the_cli_and_the_driver_do_not_import_torch():
    """Every `gguf-trainer` call and every driver start stays fast: torch loads in stages only."""
    r = subprocess.run([sys.executable, "-c", "import sys, trainer_core.cli, trainer_core.pipeline, "
                        "trainer_core.stages.corpus; print(sorted(m for m in ('torch', 'transformers', "
                        "'gradio') if m in sys.modules))"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
