"""Our token ids against the engine's own tokenizer code, compiled from the ggk 0.9.7 sdist.

    python bench/engine_tokenizer.py [--engine DIR] [--prompts FILE] [--write-fixture]

Downloads the ggk 0.9.7 sdist from PyPI (`pip download`, once, into ~/.cache/gguf-trainer) unless
--engine points at an unpacked one, compiles its tokenizer sources unchanged behind the small
driver in bench/engine_driver/ (g++; about 40 s on 2 cores), and feeds both the engine and
trainer_core every prompt of tests/data/engine_prompts.jsonl for the four packs: the student ids
as the engine assembles them (text-to-image, and the edit samples of the two Qwen3-VL packs), and
PixArt's 120-slot T5 windows (over the tiny T5's vocabulary handed to the engine as a tokenizer
pack, as bench/engine_t5_fixture.py does; the prompts of this table and of that fixture).
`--write-fixture` stores the engine's ids in tests/data/engine_tokens.json, which
tests/test_engine_tokens.py checks without a compiler. Needs no GPU; exits 0 with a note when
there is no C++ compiler. Ends with one JSON line: per pack {equal, total}, `t5_windows`
{equal, total}, and `all_equal`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))

import engine_t5_fixture  # noqa: E402
from trainer_core.contract.engine_bpe import EngineBPE  # noqa: E402
from trainer_core.contract.engine_t5 import EngineT5  # noqa: E402
from trainer_core.packs.common.tiny_models import write_qwen_tokenizer  # noqa: E402
from trainer_core.packs import get_pack  # noqa: E402

PACK_IDS = ("t5xxl_pixart", "llada_image", "qwen3vl_mageflow", "qwen3vl_qwenimage")
VERSION = "0.9.7"
PROMPTS = REPO / "tests" / "data" / "engine_prompts.jsonl"
FIXTURE = REPO / "tests" / "data" / "engine_tokens.json"


def engine_source(given: str | None) -> Path:
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gguf-trainer"
    root = cache / f"ggk-{VERSION}"
    if not (root / "vendor").is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"ggk=={VERSION}", "--no-deps", "--no-binary",
                        ":all:", "-d", str(cache)], check=True, stdout=subprocess.DEVNULL)
        with tarfile.open(cache / f"ggk-{VERSION}.tar.gz") as tar:
            tar.extractall(cache, filter="data")
    return root


def build_driver(engine: Path, out: Path) -> Path:
    env = {**os.environ, "ENGINE": str(engine), "OUT": str(out)}
    subprocess.run(["bash", str(REPO / "bench" / "engine_driver" / "build.sh")], check=True, env=env,
                   stdout=sys.stderr)
    return out / "ggk_tok"


def run_engine(binary: Path, pack_id: str, items: list) -> list[dict]:
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        f.write("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items))
    try:
        out = subprocess.run([str(binary), "--pack", pack_id, "--prompts", f.name], check=True,
                             capture_output=True, text=True, encoding="utf-8").stdout
    finally:
        os.unlink(f.name)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def items_for(pack_id: str, items: list) -> list:
    """Text-to-image prompts for every pack; edit samples only for the Qwen3-VL ones."""
    return [it for it in items if isinstance(it, str) or pack_id.startswith("qwen3vl")]


def our_ids(engine: EngineBPE, pack_id: str, item) -> list[int]:
    """What trainer_core feeds the student for a prompt (or an edit sample) of the pack."""
    pack = get_pack(pack_id)
    if pack_id.startswith("qwen3vl"):
        data = pack._data()
        text, images = (item, []) if isinstance(item, str) else (item["text"], item["images"])
        return data.build_sample(engine, text, images).ids
    return engine.encode_chunks(pack.student_chunks(item))


def compare_t5_windows(binary: Path, prompts: list[str], work: Path) -> dict[str, int]:
    """The engine's T5 windows against EngineT5's, over the tiny T5 both are handed."""
    prompts = [p for p in prompts + [p for _, p in engine_t5_fixture.PROMPTS] if p != "(a:.)"]
    tiny = engine_t5_fixture.write_tiny_t5(work / "tiny_t5", engine_t5_fixture.TEXTS)
    engine_t5_fixture.engine_pack(tiny, work / "t5pack")
    rows = engine_t5_fixture.run_driver(str(binary), work / "t5pack", prompts, work)
    ours = EngineT5.from_folder(tiny)
    equal = 0
    for prompt, row in zip(prompts, rows):
        ids, n = ours.window(prompt, engine_t5_fixture.WINDOW)
        if list(ids) == row["t5_ids"] and n == row["t5_len"]:
            equal += 1
        else:
            print(f"t5 window: {prompt!r}\n  engine {row['t5_ids'][:30]}\n  ours   {list(ids)[:30]}", file=sys.stderr)
    return {"equal": equal, "total": len(prompts)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", help="an unpacked ggk-0.9.7 sdist (default: download it from PyPI)")
    parser.add_argument("--prompts", default=str(PROMPTS))
    parser.add_argument("--write-fixture", action="store_true", help=f"write the engine's ids to {FIXTURE}")
    args = parser.parse_args()
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        print("no C++ compiler: the engine comparison is skipped", file=sys.stderr)
        print(json.dumps({"skipped": "no C++ compiler"}))
        return 0
    items = [json.loads(line) for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
    work = Path(tempfile.mkdtemp(prefix="engine-tok-"))
    binary = build_driver(engine_source(args.engine), work / "build")
    write_qwen_tokenizer(work / "qwen")
    engine = EngineBPE.from_folder(work / "qwen")
    figures: dict = {"ggk": VERSION, "libc": "-".join(platform.libc_ver()), "prompts": len(items), "packs": {}}
    fixture: dict = {"ggk": VERSION, "libc": figures["libc"], "generator": "bench/engine_tokenizer.py --write-fixture",
                     "prompts": str(Path(args.prompts).relative_to(REPO)) if Path(args.prompts).is_relative_to(REPO)
                     else args.prompts, "packs": {}}
    for pack_id in PACK_IDS:
        selected = items_for(pack_id, items)
        results = run_engine(binary, pack_id, selected)
        equal = total = 0
        rows = []
        for item, ref in zip(selected, results):
            rows.append({"item": item, "ids": ref.get("ids"), "engine_error": ref.get("engine_error")})
            if "ids" not in ref:            # the engine aborts on this prompt (e.g. a weight std::stof rejects)
                continue
            total += 1
            mine = our_ids(engine, pack_id, item)
            if mine == ref["ids"]:
                equal += 1
            else:
                print(f"{pack_id}: {item!r}\n  engine {ref['ids'][:40]}\n  ours   {mine[:40]}", file=sys.stderr)
        figures["packs"][pack_id] = {"equal": equal, "total": total}
        fixture["packs"][pack_id] = rows
    figures["t5_windows"] = compare_t5_windows(binary, [it for it in items if isinstance(it, str)], work)
    figures["all_equal"] = all(v["equal"] == v["total"]
                               for v in [*figures["packs"].values(), figures["t5_windows"]])
    if args.write_fixture:
        packs = ",\n".join(f"  {json.dumps(k)}: [\n" + ",\n".join("   " + json.dumps(r, ensure_ascii=False) for r in rows)
                           + "\n  ]" for k, rows in fixture.pop("packs").items())
        head = json.dumps(fixture, ensure_ascii=False)[:-1]
        FIXTURE.write_text(f'{head}, "packs": {{\n{packs}\n}}}}\n', encoding="utf-8")
        print(f"wrote {FIXTURE}", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
