"""Our token ids against the engine's own tokenizer code, compiled from the ggk 0.9.7 sdist behind the small
driver bench/engine_driver/ggk_tok.cpp (bench/engine_driver/build.sh; g++, about 40 s on 2 cores).

The driver transcribes the prompt assembly of a few model versions' conditioners (`ggk_tok --versions`); every
pack whose main version (`EngineFacts.versions[0]`) is one of them is checked: the student ids as the engine
assembles them for each prompt of tests/data/engine_prompts.jsonl (text-to-image, and the edit samples for a
pack that declares `edit_tokens`), and the T5 windows of a version whose rows carry them, over the tiny T5's
vocabulary handed to the engine as a tokenizer pack (t5_fixture.py). tests/data/engine_tokens.json keeps the
engine's ids (tests/test_engine_tokens.py checks them without a compiler).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import DRIVERS, REPO, t5_fixture
from .driver import VERSION

__all__ = ["PROMPTS", "FIXTURE", "build_driver", "driver_versions", "run_engine", "items_for", "our_ids", "check"]

PROMPTS = REPO / "tests" / "data" / "engine_prompts.jsonl"
FIXTURE = REPO / "tests" / "data" / "engine_tokens.json"


def build_driver(engine: Path, out: Path) -> Path:
    env = {**os.environ, "ENGINE": str(engine), "OUT": str(out)}
    subprocess.run(["bash", str(DRIVERS / "build.sh")], check=True, env=env, stdout=sys.stderr)
    return out / "ggk_tok"


def driver_versions(binary: Path) -> list[str]:
    """The model versions whose prompt assembly the driver transcribes."""
    return json.loads(subprocess.run([str(binary), "--versions"], check=True, capture_output=True, text=True).stdout)


def run_engine(binary: Path, version: str, items: list) -> list[dict]:
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        f.write("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items))
    try:
        out = subprocess.run([str(binary), "--version", version, "--prompts", f.name], check=True,
                             capture_output=True, text=True, encoding="utf-8").stdout
    finally:
        os.unlink(f.name)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def items_for(pack: Any, items: list) -> list:
    """Text-to-image prompts for every pack; the edit samples too for a pack that declares edit_tokens."""
    return [it for it in items if isinstance(it, str) or pack.engine.edit_tokens]


def our_ids(engine: Any, pack: Any, item: Any) -> list[int]:
    """What trainer_core feeds the student for a prompt (or an edit sample) of the pack: the edit template's
    sample (the Qwen3-VL contract's build_sample) for a pack that declares edit_tokens, else its chunks."""
    if pack.engine.edit_tokens:
        text, images = (item, []) if isinstance(item, str) else (item["text"], item["images"])
        return pack._data().build_sample(engine, text, images).ids
    return engine.encode_chunks(pack.student_chunks(item))


def compare_t5_windows(binary: Path, version: str, prompts: list[str], work: Path) -> dict[str, int]:
    """The engine's T5 windows on `version`'s path against EngineT5's, over the tiny T5 both are handed."""
    from trainer_core.contract.engine_t5 import EngineT5
    from trainer_core.packs.common.t5.tiny import write_tiny_t5
    prompts = [p for p in prompts + [p for _, p in t5_fixture.PROMPTS] if p != "(a:.)"]
    tiny = write_tiny_t5(work / "tiny_t5", t5_fixture.TEXTS)
    t5_fixture.engine_pack(tiny, work / "t5pack")
    rows = t5_fixture.run_driver(str(binary), work / "t5pack", prompts, work, version)
    ours = EngineT5.from_folder(tiny)
    equal = 0
    for prompt, row in zip(prompts, rows):
        ids, n = ours.window(prompt, t5_fixture.WINDOW)
        if list(ids) == row["t5_ids"] and n == row["t5_len"]:
            equal += 1
        else:
            print(f"t5 window: {prompt!r}\n  engine {row['t5_ids'][:30]}\n  ours   {list(ids)[:30]}", file=sys.stderr)
    return {"equal": equal, "total": len(prompts)}


def check(engine_dir: Path, prompts_file: Path, write_fixture: bool) -> dict:
    """The whole comparison; with `write_fixture`, the engine's ids stored in FIXTURE. The figures: per pack
    {equal, total}, t5_windows {equal, total}, all_equal."""
    import shutil

    from trainer_core.contract.engine_bpe import EngineBPE
    from trainer_core.packs import PACKS
    from trainer_core.packs.common.tiny_models import write_qwen_tokenizer
    items = [json.loads(line) for line in prompts_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    work = Path(tempfile.mkdtemp(prefix="engine-tok-"))
    binary = build_driver(engine_dir, work / "build")
    versions = driver_versions(binary)
    write_qwen_tokenizer(work / "qwen")
    engine = EngineBPE.from_folder(work / "qwen")
    figures: dict = {"ggk": VERSION, "libc": "-".join(platform.libc_ver()), "prompts": len(items), "packs": {}}
    fixture: dict = {"ggk": VERSION, "libc": figures["libc"], "generator": "bench/engine_tokenizer.py --write-fixture",
                     "prompts": str(prompts_file.relative_to(REPO)) if prompts_file.is_relative_to(REPO)
                     else str(prompts_file), "packs": {}}
    t5_version = None
    demos_first = sorted(PACKS.values(), key=lambda p: (not p.demo_order, p.demo_order, p.order))
    for pack in (p for p in demos_first if p.engine and p.engine.versions[0] in versions):
        selected = items_for(pack, items)
        results = run_engine(binary, pack.engine.versions[0], selected)
        equal = total = 0
        rows = []
        for item, ref in zip(selected, results):
            rows.append({"item": item, "ids": ref.get("ids"), "engine_error": ref.get("engine_error")})
            t5_version = t5_version or (pack.engine.versions[0] if "t5_ids" in ref else None)
            if "ids" not in ref:            # the engine aborts on this prompt (e.g. a weight std::stof rejects)
                continue
            total += 1
            mine = our_ids(engine, pack, item)
            if mine == ref["ids"]:
                equal += 1
            else:
                print(f"{pack.id}: {item!r}\n  engine {ref['ids'][:40]}\n  ours   {mine[:40]}", file=sys.stderr)
        figures["packs"][pack.id] = {"equal": equal, "total": total}
        fixture["packs"][pack.id] = rows
    texts = [it for it in items if isinstance(it, str)]
    figures["t5_windows"] = (compare_t5_windows(binary, t5_version, texts, work) if t5_version
                             else {"equal": 0, "total": 0})
    figures["all_equal"] = all(v["equal"] == v["total"]
                               for v in [*figures["packs"].values(), figures["t5_windows"]])
    if write_fixture:
        packs = ",\n".join(f"  {json.dumps(k)}: [\n" + ",\n".join("   " + json.dumps(r, ensure_ascii=False) for r in rows)
                           + "\n  ]" for k, rows in fixture.pop("packs").items())
        head = json.dumps(fixture, ensure_ascii=False)[:-1]
        FIXTURE.write_text(f'{head}, "packs": {{\n{packs}\n}}}}\n', encoding="utf-8")
        print(f"wrote {FIXTURE}", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    return figures
