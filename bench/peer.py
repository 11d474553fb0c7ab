"""Our trainer against the published gguf-trainer 0.0.14 on identical inputs: stage times and peak RSS.

    PYTHONPATH=. python bench/peer.py [--pack ID ...] [--rounds R] [--steps N]
                                      [--peer-python PATH] [--keep DIR]

The inputs are built once (our fixtures): a random 1024-d 2-layer Qwen3 student (pig_clip's layer
shapes: 16 heads, 8 KV heads, head_dim 128, MLP 3072) with the real 151,936-token vocabulary, written
as a pig_clip f16 GGUF beside the real Qwen BPE tokenizer folder; 300 train / 64 val generated prompts
(train.txt / val.txt); for the image packs 96 generated captioned scenes, from which OUR corpus stage
builds data/{train,val}.jsonl + data/images once, copied byte for byte into both projects (300 train
and 64 val samples). Both trainers run their mock teacher (GGUF_TRAINER_MOCK_TEACHER=1), which has the
real row shapes without a teacher on disk (T5-XXL 4096-d; LLaDA 256 × 2560; Qwen3-VL-4B 2560-d;
Qwen3-VL-8B 4096-d; FLUX.3 Klein's stacked Qwen3-VL-4B layers; Ming and Qwen3.5 4096-d), so no
teacher weights are written for either. Settings of both: CPU, adapter width
128, depth 2, batch 8, warmup 20, log / val / save every 10 / 50 / 50, 200 steps; text packs read the
prompt files in "files" corpus mode; the precompute budgets, shard sizes, lr, σ floor and seed of the
peer's project are set to ours (Qwen-Image, Ming, the Qwen3.5 bridge: reference areas 128² / 192²,
two-image 128², as our demo).

Our project is made with `gguf-trainer new` + `set`; the peer's (it has no `new` and its `set` takes
only the step count) the way its GUI's Create and Save do it: its Project.create, then its
save_config with the settings above. Per pack, `--rounds` rounds of [ours, theirs] (the order
alternates each round) each run `run` in a fresh foreground process on a fresh copy of its prepared
project (materials and corpus kept, nothing else). A stage's time is its started → finished span in
that trainer's own state.json, the whole run the wall clock of the process; peak RSS is ru_maxrss of
os.wait4 (the run process and every child it waited for). The load average is recorded before each
run: the machine should be quiet. Figures are medians over the rounds; ratio = ours ÷ theirs.

Which packs, and what each gets beyond the common settings, is bench/peer_packs.json (facts about 0.0.14).
Ming's and the Qwen3.5 bridge's exports embed the teacher's vocabulary (0.0.14 skips it when the
teacher is absent, ours refuses), so both projects point materials.teacher at a tiny tokenizer of the
real format: Ming our demo's tiny Ling tokenizer (real special ids); Qwen3.5 our demo's tiny BPE with
"user" and "assistant" moved to the real ids 0.0.14's mock checks (846, 74455) and a config.json with
the real widths. Both leave out what 0.0.14 lacks or cannot do without weights: Ming's layer samples,
vision bridge and vision export; the bridge's FLUX.3 Klein head (its caption samples need a VLM).

The last stdout line is JSON: {"date", "machine", "rounds", "steps", "load": [1-min load before each
run], pack_id: {"ours": {stage: s, "total": s, "peak_rss_mib": m, "load_before": [...]},
"theirs": {...}, "ratio": {stage: ours/theirs, "total", "peak_rss"}}}.
With --keep DIR everything stays under DIR: inputs/, <pack>/{ours,theirs}/prepared/<folder> (the
projects as prepared, for profiling: copy one and `run` it) and <pack>/{ours,theirs}/run/<folder>
(the last round's run, its log in run.log beside it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEER_VERSION = "0.0.14"
DEFAULT_PEER = "/tmp/peer-venv/bin/python"
STAGES = ("precompute_val", "precompute_train", "train", "export", "eval")
# the packs 0.0.14 has, in the order they run, and what each gets beyond COMMON (facts about that release)
PEER_PACKS: dict[str, dict] = json.loads((REPO / "bench" / "peer_packs.json").read_text(encoding="utf-8"))["packs"]
PACKS = tuple(PEER_PACKS)
N_TRAIN, N_VAL, N_IMAGES = 300, 64, 96

# the settings, the same for both trainers
COMMON = {
    "precompute.device": "cpu", "train.device": "cpu", "train.width": 128, "train.depth": 2,
    "train.batch_size": 8, "train.warmup": 20, "train.log_every": 10, "train.val_every": 50,
    "train.save_every": 50, "export.export_sigvq": False, "export.run_eval": True,
}
# the image packs' corpus (built once by our corpus stage, then copied into both projects)
IMAGE_CORPUS = {"corpus.presets": [], "corpus.image_presets": [], "corpus.n_image": 150, "corpus.n_two": 20,
                "corpus.n_text": 130, "corpus.n_val_image": 32, "corpus.n_val_text": 32}
# settings whose value in the peer's project is made ours (pack defaults of both may differ)
COPIED = ("precompute.shard_size", "precompute.val_shard_size", "precompute.teacher_batch",
          "precompute.tok_budget", "precompute.student_batch", "precompute.student_tok_budget",
          "precompute.vis_tok_budget", "precompute.teacher_mode", "precompute.student_dtype",
          "train.lr", "train.weight_decay", "train.grad_clip", "train.cos_weight", "train.sigma_floor",
          "train.seed", "train.batch_tokens", "precompute.placement", "train.seed_rank", "train.max_slots")

# run with the peer's interpreter: create its project as its GUI's Create + Save do
_PEER_CREATE = """
import json, sys
from gguf_trainer.project import Project
path, name, pack, settings = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
p = Project(path)
p.create(name, pack)
config = p.config
for key, value in settings.items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
p.save_config(config)
"""


# ---------------------------------------------------------------- inputs

def build_inputs(folder: Path, images: bool) -> None:
    """The student GGUF + tokenizer folder, train/val prompt files and (once asked) the scenes, under
    `folder`; what is already complete is kept (the same arguments give the same bytes)."""
    import torch
    from transformers import Qwen3Model

    from trainer_core.packs.common.tiny_models import (SEED, demo_prompts, tiny_qwen3_config, write_demo_images,
                                            write_qwen_tokenizer, write_student_config, write_student_gguf)
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / ".student-done"
    if not done.is_file():
        config = tiny_qwen3_config(hidden_size=1024, layers=2, heads=16, kv_heads=8, head_dim=128,
                                   intermediate=3072)
        write_qwen_tokenizer(folder / "pig-clip-tokenizer")
        write_student_config(folder / "pig-clip-tokenizer", config)
        torch.manual_seed(SEED)
        write_student_gguf(Qwen3Model(config), folder / "pig_clip-bench-f16.gguf", dtype="f16")
        prompts = demo_prompts(N_TRAIN + N_VAL)
        (folder / "train.txt").write_text("".join(p + "\n" for p in prompts[:N_TRAIN]), encoding="utf-8")
        (folder / "val.txt").write_text("".join(p + "\n" for p in prompts[N_TRAIN:]), encoding="utf-8")
        (folder / "prompts.txt").write_text("".join(p + "\n" for p in prompts), encoding="utf-8")
        done.touch()
    if images and not (folder / ".images-done").is_file():
        write_demo_images(folder / "images", N_IMAGES, SEED)
        (folder / ".images-done").touch()


def is_image_pack(pack: str) -> bool:
    from trainer_core.packs import get_pack
    return get_pack(pack).corpus_kind.reference_images


def build_teacher_tokenizer(pack: str, inputs: Path) -> None:
    """The teacher material both trainers' exports read for `pack` (the vocabulary the adapter GGUF
    carries; no weights: the mocks run), of the format bench/peer_packs.json names."""
    folder = inputs / f"{pack}-teacher"
    if (folder / ".done").is_file():
        return
    TEACHER_TOKENIZERS[PEER_PACKS[pack]["teacher_tokenizer"]](folder)
    (folder / ".done").touch()


def _ling_teacher(folder: Path) -> None:
    """Our demo's tiny Ling tokenizer (real special ids) under mllm/."""
    from trainer_core.packs.ming_image.tiny import write_tiny_ling_tokenizer
    write_tiny_ling_tokenizer(folder / "mllm")


def _qwen35_teacher(folder: Path) -> None:
    """Our demo's tiny Qwen3.5-format BPE with "user" and "assistant" moved to their real ids (846, 74455: 0.0.14's
    mock checks them), beside a config.json with the real widths (ours reads the teacher's dimensions from it)."""
    from trainer_core.packs.qwen35_bridge.tiny import write_tiny_tokenizer
    write_tiny_tokenizer(folder)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    for token, real in (("user", 846), ("assistant", 74455)):      # swap ids; merges name tokens, not ids
        other = by_id[real]
        vocab[token], vocab[other] = real, vocab[token]
        by_id[vocab[other]], by_id[real] = other, token
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen3_5", "text_config": {"hidden_size": 4096, "vocab_size": 248320, "num_hidden_layers": 32},
        "vision_config": {"out_hidden_size": 4096}}) + "\n", encoding="utf-8")


# the teacher tokenizers bench/peer_packs.json names, by format
TEACHER_TOKENIZERS = {"ling": _ling_teacher, "qwen3.5": _qwen35_teacher}


def pack_settings(pack: str, inputs: Path, steps: int) -> dict[str, object]:
    """Every setting both projects of `pack` get (dotted keys, JSON values)."""
    settings: dict[str, object] = {**COMMON, "train.steps": steps,
                                   "materials.student.path": str(inputs / "pig_clip-bench-f16.gguf"),
                                   "materials.student_tokenizer.path": str(inputs / "pig-clip-tokenizer")}
    if is_image_pack(pack):
        settings.update(IMAGE_CORPUS, **{"corpus.image_folders": [str(inputs / "images")],
                                         "corpus.extra_files": [str(inputs / "prompts.txt")]})
    else:
        settings.update({"corpus.mode": "files", "corpus.train_file": str(inputs / "train.txt"),
                         "corpus.val_file": str(inputs / "val.txt")})
    settings.update(PEER_PACKS[pack].get("settings", {}))
    if "teacher_tokenizer" in PEER_PACKS[pack]:
        settings["materials.teacher.path"] = str(inputs / f"{pack}-teacher")
    return settings


# ---------------------------------------------------------------- the two projects

def _env(home: Path, ours: bool = False) -> dict[str, str]:
    """The environment of either trainer: the mock teacher, offline, a home of its own. Ours gets the repo
    on PYTHONPATH, the peer none at all (our repo's gguf_trainer.egg-info would shadow its metadata)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(GGUF_TRAINER_MOCK_TEACHER="1", HF_HUB_OFFLINE="1", GGUF_TRAINER_HOME=str(home), HOME=str(home))
    if ours:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    return env


def _ours(*args: str, home: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "trainer_core", *args], env=_env(home, ours=True),
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"gguf-trainer {' '.join(args)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def _dotted(config: dict, key: str) -> object:
    node: object = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def prepare_ours(pack: str, project: Path, settings: dict[str, object], home: Path) -> dict:
    """`new` + `set` (+ the corpus stage for an image pack); returns our project.json."""
    _ours("new", "--project", str(project), "--pack", pack, home=home)
    assignments = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in settings.items()]
    _ours("set", "--project", str(project), "--set", "precompute.mock_teacher=true",
          *(a for assignment in assignments for a in ("--set", assignment)), home=home)
    if is_image_pack(pack):
        _ours("run", "--project", str(project), "--only", "corpus", home=home)
    for name in ("state.json", "events.jsonl", "pipeline.log"):       # the corpus run's traces
        (project / name).unlink(missing_ok=True)
    return json.loads((project / "project.json").read_text(encoding="utf-8"))


def prepare_theirs(peer_python: str, pack: str, project: Path, settings: dict[str, object],
                   ours: dict, ours_project: Path, home: Path) -> None:
    """The peer's project with the same settings, the copied ones taken from our project.json, and
    (image packs) our corpus."""
    theirs = dict(settings)
    for key in COPIED:
        value = _dotted(ours, key)
        if value is not None:
            theirs[key] = value
    project.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([peer_python, "-c", _PEER_CREATE, str(project), ours["name"], pack, json.dumps(theirs)],
                       env=_env(home), cwd=project.parent, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"creating the peer's {pack} project failed:\n{r.stderr[-2000:]}")
    if is_image_pack(pack):
        shutil.copytree(ours_project / "data", project / "data")


# ---------------------------------------------------------------- one run

def run_once(command: list[str], prepared: Path, run_root: Path, env: dict[str, str]) -> dict[str, float]:
    """Copy `prepared` to a fresh run_root/<folder>, run `command + [project]` there in the foreground:
    seconds per stage (its state.json), the whole run's wall time and its peak RSS in MiB."""
    shutil.rmtree(run_root, ignore_errors=True)
    run_root.mkdir(parents=True)
    project = run_root / prepared.name
    shutil.copytree(prepared, project)
    with open(run_root / "run.log", "wb") as log:
        started = time.monotonic()
        proc = subprocess.Popen([*command, str(project)], env=env, cwd=run_root, stdout=log,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    state = json.loads((project / "state.json").read_text(encoding="utf-8"))
    if proc.returncode or state.get("status") != "done":
        tail = (run_root / "run.log").read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(command)} {project} ended {state.get('status')} (exit {proc.returncode}):\n{tail}")
    out: dict[str, float] = {}
    for name in STAGES:
        stage = state.get("stages", {}).get(name, {})
        if stage.get("skipped") or "started" not in stage or "finished" not in stage:
            raise SystemExit(f"{project}: stage {name} has no started/finished span in state.json ({stage})")
        out[name] = round(stage["finished"] - stage["started"], 2)
    out["total"] = round(wall, 2)
    out["peak_rss_mib"] = round(usage.ru_maxrss / 1024, 1)     # Linux: KiB
    return out


def _median(runs: list[dict[str, float]], loads: list[float]) -> dict[str, object]:
    out: dict[str, object] = {k: round(statistics.median(r[k] for r in runs), 2)
                              for k in (*STAGES, "total", "peak_rss_mib")}
    out["load_before"] = loads
    return out


def _ratio(ours: dict, theirs: dict) -> dict[str, float | None]:
    keys = {**{k: k for k in (*STAGES, "total")}, "peak_rss": "peak_rss_mib"}
    return {name: (round(ours[k] / theirs[k], 3) if theirs[k] else None) for name, k in keys.items()}


def measure(pack: str, args: argparse.Namespace, work: Path, loads: list[float]) -> dict[str, object]:
    inputs = work / "inputs"
    build_inputs(inputs, images=is_image_pack(pack))
    if "teacher_tokenizer" in PEER_PACKS[pack]:
        build_teacher_tokenizer(pack, inputs)
    base = work / pack
    shutil.rmtree(base, ignore_errors=True)
    settings = pack_settings(pack, inputs, args.steps)
    for home in ("home-ours", "home-theirs"):
        (work / home).mkdir(exist_ok=True)
    from trainer_core.packs import get_pack
    folder = get_pack(pack).default_folder          # ours' default, which is also 0.0.14's default_name
    ours_prepared = base / "ours" / "prepared" / folder
    theirs_prepared = base / "theirs" / "prepared" / folder
    ours_config = prepare_ours(pack, ours_prepared, settings, work / "home-ours")
    prepare_theirs(args.peer_python, pack, theirs_prepared, settings, ours_config, ours_prepared, work / "home-theirs")
    trainers = {
        "ours": ([sys.executable, "-m", "trainer_core", "run", "--project"], ours_prepared,
                 _env(work / "home-ours", ours=True)),
        "theirs": ([args.peer_python, "-m", "gguf_trainer", "run", "--project"], theirs_prepared,
                   _env(work / "home-theirs")),
    }
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "theirs": []}
    before: dict[str, list[float]] = {"ours": [], "theirs": []}
    for round_i in range(args.rounds):
        order = ("ours", "theirs") if round_i % 2 == 0 else ("theirs", "ours")
        for who in order:
            command, prepared, env = trainers[who]
            load = round(os.getloadavg()[0], 2)
            loads.append(load)
            before[who].append(load)
            seconds = run_once(command, prepared, base / who / "run", env)
            runs[who].append(seconds)
            print(f"{pack} round {round_i + 1} {who}: {seconds} (load {load:.2f})", file=sys.stderr, flush=True)
    ours, theirs = _median(runs["ours"], before["ours"]), _median(runs["theirs"], before["theirs"])
    return {"ours": ours, "theirs": theirs, "ratio": _ratio(ours, theirs)}


# ---------------------------------------------------------------- output

def table(figures: dict[str, object], packs: list[str]) -> str:
    lines = []
    for pack in packs:
        f = figures[pack]
        assert isinstance(f, dict)
        ours, theirs, ratio = f["ours"], f["theirs"], f["ratio"]
        lines.append(f"{pack}  (load before ours {ours['load_before']}, theirs {theirs['load_before']})")
        lines.append(f"  {'stage':<18}{'ours s':>10}{'theirs s':>10}{'ours/theirs':>13}")
        for stage in (*STAGES, "total"):
            r = ratio[stage]
            lines.append(f"  {stage:<18}{ours[stage]:>10.2f}{theirs[stage]:>10.2f}"
                         f"{(f'{r:.2f}' if r is not None else '-'):>13}")
        lines.append(f"  {'peak RSS MiB':<18}{ours['peak_rss_mib']:>10.0f}{theirs['peak_rss_mib']:>10.0f}"
                     f"{ratio['peak_rss']:>13.2f}")
    return "\n".join(lines)


def check_peer(peer_python: str) -> str | None:
    """None when `peer_python` runs gguf-trainer 0.0.14, else why not."""
    how = (f"create it with: python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install torch==2.13.0 "
           f"&& /tmp/peer-venv/bin/pip install gguf-trainer=={PEER_VERSION}")
    if not Path(peer_python).is_file():
        return f"{peer_python} does not exist; {how}"
    r = subprocess.run([peer_python, "-c", "import importlib.metadata as m; print(m.version('gguf-trainer'))"],
                       env=_env(Path(tempfile.gettempdir())), cwd=tempfile.gettempdir(), capture_output=True,
                       text=True)
    if r.returncode or r.stdout.strip() != PEER_VERSION:
        return f"{peer_python} has no gguf-trainer {PEER_VERSION} ({r.stdout.strip() or 'not installed'}); {how}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", nargs="*", default=list(PACKS), choices=PACKS)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs per pack (default 2)")
    parser.add_argument("--steps", type=int, default=200, help="train.steps of both (default 200)")
    parser.add_argument("--peer-python", default=DEFAULT_PEER, help=f"the peer's interpreter (default {DEFAULT_PEER})")
    parser.add_argument("--keep", metavar="DIR", help="build and keep everything under DIR (for profiling)")
    args = parser.parse_args()
    problem = check_peer(args.peer_python)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    figures: dict[str, object] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                  "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                                             f"Python {platform.python_version()}",
                                  "rounds": args.rounds, "steps": args.steps}
    loads: list[float] = []
    figures["load"] = loads
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        work = Path(args.keep).resolve() if args.keep else Path(tmp)
        for pack in args.pack:
            figures[pack] = measure(pack, args, work, loads)
    print(table(figures, args.pack))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
