"""ggk_cond, the engine's own conditioning: the sdist, its build, one run over a batch of prompts, and the
readers of what it dumps and logs.

bench/engine_driver/build_cond.sh builds the sdist's CPU backend with its CMake and
bench/engine_driver/ggk_cond.cpp against the engine's sources, unchanged (objects cached under
~/.cache/gguf-trainer); the driver takes one JSON request a line and conditions it with SD_DUMP_COND set.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from . import DRIVERS
from .t5_fixture import engine_pack

__all__ = ["VERSION", "cache_dir", "engine_source", "missing_tools", "build_driver", "run_engine", "rows",
           "int_lines", "logged_ids", "logged_slots", "dumped_ids"]

VERSION = "0.9.7"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gguf-trainer"


def engine_source(given: str | None) -> Path:
    """The unpacked ggk sdist: `given`, else downloaded from PyPI once (`pip download`) into the cache."""
    if given:
        return Path(given)
    cache = cache_dir()
    root = cache / f"ggk-{VERSION}"
    if not (root / "vendor").is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"ggk=={VERSION}", "--no-deps", "--no-binary",
                        ":all:", "-d", str(cache)], check=True, stdout=subprocess.DEVNULL)
        with tarfile.open(cache / f"ggk-{VERSION}.tar.gz") as tar:
            tar.extractall(cache, filter="data")
    return root


def missing_tools(*tools: str) -> list[str]:
    """The build tools (the C++ compiler, $CXX or g++, and `tools`) this machine lacks."""
    return [tool for tool in (os.environ.get("CXX", "g++"), *tools) if shutil.which(tool) is None]


def build_driver(engine: Path) -> Path:
    """bench/engine_driver/build_cond.sh into the cache (objects kept between runs); the driver's path."""
    out = cache_dir() / f"ggk-{VERSION}-cond"
    env = {**os.environ, "ENGINE": str(engine), "OUT": str(out)}
    subprocess.run(["bash", str(DRIVERS / "build_cond.sh")], check=True, env=env, stdout=sys.stderr)
    return out / "ggk_cond"


def run_engine(driver: Path, ours: Any, version: str, prompts: list[str], work: Path, vision: Path | None = None,
               extra: list[dict] | None = None) -> list[dict]:
    """The driver on every prompt, `version`'s conditioner with the student, the adapter and the T5 vocabulary of
    `ours` (an Ours, or what of one the teacher check hands over); `extra`: each prompt's further fields, such
    as its "images" and the request's "width" and "height"; `vision`: the tower file. Its answers, each with its
    dump folder; a prompt the engine aborts on is answered {"engine_abort": the line}."""
    items = []
    for i, text in enumerate(prompts):
        dump = work / version / str(i)
        dump.mkdir(parents=True, exist_ok=True)
        items.append({"text": text, "dump": str(dump), **(extra[i] if extra else {})})
    env = dict(os.environ)
    if ours.seeded:                        # the demo's tiny T5 vocabulary, as a tokenizer pack (SD_TOKENIZER_PACK)
        from trainer_core.packs.lookup import resolve_material
        engine_pack(resolve_material(ours.project, "teacher"), work / "t5pack")
        env["SD_TOKENIZER_PACK"] = str(work / "t5pack")
    command = [str(driver), "--version", version, "--llm", str(ours.student_gguf),
               *(["--adapter", str(ours.adapter_path)] if ours.adapter_path else []),
               "--threads", str(min(4, os.cpu_count() or 1)), *(["--vision", str(vision)] if vision else [])]
    answers: list[dict] = []
    while len(answers) < len(items):          # a prompt the engine aborts on: note it, go on with the next
        rest = items[len(answers):]
        done = subprocess.run(command, input="".join(json.dumps(it, ensure_ascii=False) + "\n" for it in rest),
                              capture_output=True, text=True, encoding="utf-8", env=env)
        got = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        answers += got
        if done.returncode != 0 and len(got) < len(rest):
            lines = [x for x in done.stderr.splitlines() if "GGML_ASSERT" in x or "GGML_ABORT" in x or "error" in x]
            if not lines:
                raise SystemExit(f"the engine driver failed on {version} (exit {done.returncode}):\n"
                                 f"{done.stderr[-3000:]}")
            answers.append({"engine_abort": lines[-1].split("/src/")[-1]})
    for item, answer in zip(items, answers):
        answer["dump"] = Path(item["dump"])
    return answers


def rows(path: Path, width: int) -> np.ndarray:
    return np.fromfile(path, dtype="<f4").reshape(-1, width)


def int_lines(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def _logged(log: list[str], what: str) -> list[str] | None:
    """The items of the first logged list `what (N): [a, b, …]` (a conditioner's debug line), None without one."""
    for line in log:
        m = re.search(re.escape(what) + r" \((\d+)\): \[([^\]]*)\]", line)
        if m:
            return [x.strip() for x in m.group(2).split(",") if x.strip()]
    return None


def logged_ids(log: list[str], what: str = "student tokens") -> list[int] | None:
    """The ids a conditioner logs instead of dumping them ("… student tokens (N): [a, b, …]")."""
    items = _logged(log, what)
    return None if items is None else [int(x) for x in items]


def logged_slots(log: list[str], what: str = "adapter slots") -> list | None:
    """The adapter's slot ids a conditioner logs ("… adapter slots (N): [a, b, <imagePatch> x 576, …]"), an image
    run as ("patch", count)."""
    items = _logged(log, what)
    if items is None:
        return None
    out: list = []
    for item in items:
        run = re.fullmatch(r"<imagePatch> x (\d+)", item)
        out.append(("patch", int(run.group(1))) if run else int(item))
    return out


def dumped_ids(answer: dict) -> list[int] | None:
    """The student ids the engine fed: its tokens.txt, else the ids its conditioner logged."""
    if (answer["dump"] / "tokens.txt").exists():
        return int_lines(answer["dump"] / "tokens.txt")
    return logged_ids(answer.get("log", []))
