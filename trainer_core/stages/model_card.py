"""The model card beside the exports: `<name>-README.md` and its plot `<name>-quality.png` in the output folder.

Not a stage: the export and eval stages and every snapshot call `write_card` after they wrote, so the card always
describes the newest file with its own figures. It describes the final export `<name>-f16.gguf`, else the newest
snapshot; its figures are eval.json's when eval.json scored that file (and is at least as new), a snapshot's own
evaluation otherwise, none before an evaluation. `gguf-trainer publish` sends it as the repo's README.md.

The YAML front matter is the Hub's model-card metadata (`library_name`, `tags`, `base_model`: the teacher's and the
student's repos from the pack's materials, `license` where the teacher's downloaded model card states one,
`model-index` with the evaluation's figures and the prompts it scored); huggingface_hub's `ModelCard.load` reads it.
The card names files by their names only: no path of this machine, never the token. A demo project's or a
mock-teacher run's card says in its first line that it is a machinery check. Pure text and a matplotlib figure
(the Agg canvas, no pyplot); the files are written atomically.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import time
from pathlib import Path
from typing import Any

from trainer_core import __version__
from trainer_core.base.atomic import atomic_path, atomic_write_text, read_json
from trainer_core.contract import checkpoints
from trainer_core.contract.shards import mock_enabled, read_contract
from trainer_core.packs.eval_guide import eval_lines, machinery_note
from trainer_core.packs.lookup import resolve_material
from trainer_core.project import Project

__all__ = ["write_card", "card_text", "described_file", "card_figures", "plain_command", "MACHINERY_LINE"]

MACHINERY_LINE = "**Machinery check, not a usable adapter:**"
_COUNTS = ("trained_steps", "planned_steps", "val_batches", "val_samples")   # eval.json's counts: no figures
_TEACHER_ID = "teacher"          # the material id every pack gives its teacher
_STUDENT_REPO_ID = "student_tokenizer"


def _snapshots(project: Project) -> list[dict[str, Any]]:
    """snapshots.json's entries (snapshot.py writes it)."""
    data = read_json(project.snapshots_json, {})
    entries = data.get("snapshots", []) if isinstance(data, dict) else []
    return [e for e in entries if isinstance(e, dict)]


def described_file(project: Project) -> tuple[Path, dict[str, Any] | None] | None:
    """The GGUF the card describes (the final export, else the newest snapshot) and its snapshot entry; None
    when nothing is exported."""
    final = project.gguf_path()
    if final.is_file():
        return final, None
    for entry in sorted(_snapshots(project), key=lambda e: (e.get("step", 0), e.get("time", 0)), reverse=True):
        path = project.output_dir() / str(entry.get("name", ""))
        if entry.get("name") and path.is_file():
            return path, entry
    return None


def card_figures(project: Project, gguf: Path, snapshot: dict[str, Any] | None) -> dict[str, float]:
    """The numeric figures of the described file's evaluation: eval.json's when it scored `gguf` and is at least
    as new; a snapshot's own evaluation; {} when there is none."""
    if snapshot is not None:
        found = snapshot.get("eval") or {}
    else:
        record = read_json(project.eval_json, None)
        fresh = (isinstance(record, dict) and Path(str(record.get("gguf", ""))).name == gguf.name
                 and project.eval_json.stat().st_mtime >= gguf.stat().st_mtime)
        found = record if fresh else {}
    numbers = {k: v for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    names = [*(project.pack.judge.keys() if project.pack.judge else ()), *project.pack.metric_names, "roundtrip_cos"]
    return {k: float(numbers[k]) for k in dict.fromkeys(names) if k in numbers and k not in _COUNTS}


def plain_command(command: str) -> str:
    """The command line with every absolute path cut to its file name (the files sit beside the card)."""
    for word in shlex.split(command):
        if os.path.isabs(word):
            command = command.replace(shlex.quote(word), shlex.quote(os.path.basename(word))).replace(
                word, os.path.basename(word))
    return command


def _repos(project: Project) -> tuple[list[str], list[str]]:
    """(base_model: the teacher's and the student's repos, datasets: the Hub datasets the corpus draws from)."""
    materials = project.pack.project_materials(project)
    teacher = [m.repo for m in materials if m.id == _TEACHER_ID and m.repo] or [project.pack.teacher_repo]
    student = [m.repo for m in materials if m.id == _STUDENT_REPO_ID and m.repo]
    datasets = [m.repo for m in materials if m.repo_type == "dataset" and m.repo]
    return list(dict.fromkeys([*teacher, *student])), datasets


def _teacher_license(project: Project) -> str | None:
    """The `license` of the teacher's own model card, when its snapshot on disk has one."""
    folder = resolve_material(project, _TEACHER_ID)
    card = folder / "README.md" if folder is not None and folder.is_dir() else None
    if card is None or not card.is_file():
        return None
    try:
        from huggingface_hub import ModelCard
        value = ModelCard.load(card, ignore_metadata_errors=True).data.to_dict().get("license")
    except Exception:            # noqa: BLE001 — a card we cannot read states nothing we can use
        return None
    return value if isinstance(value, str) and value else None


def _prompts(project: Project) -> str:
    """The prompts the evaluation scored, in words (file names only)."""
    c = project.settings.corpus
    sources = [*(c.presets if c.mode == "presets" else []), *(Path(f).name for f in c.extra_files),
               *(Path(f).name for f in (c.train_file, c.val_file) if f and c.mode == "files"),
               *(c.image_presets or [])]
    named = ", ".join(sources) or "its own files"
    return f"{c.n_val} held-out validation prompts of the corpus ({named}, seed {c.seed})"


def _verdict(project: Project, figures: dict[str, float], note: str | None) -> str:
    if note:
        return "a machinery check (see the first line): these figures say nothing about quality."
    if not figures:
        return "not evaluated yet."
    if figures.get("roundtrip_cos", 1.0) < 0.999:
        return "do not use: the GGUF does not reproduce its checkpoint (roundtrip_cos below 0.999)."
    guide = project.pack.judge
    if guide is None:
        return "no judging guide for this pack; compare the figures with a run you trust."
    key, value, figure = guide.rows(figures)[0]
    if value is None:
        return f"the evaluation has no {key}; export and evaluate again."
    floor = _first_number(figure)
    if floor is None:
        return f"judge by {key} = {value:.4f}; no figure is published to compare it with ({guide.good})."
    if value >= floor:
        return f"at or above the published figure: {key} {value:.4f} vs {figure}."
    return f"below the published figure: {key} {value:.4f} vs {figure}; train longer or on more prompts."


def _first_number(text: str | None) -> float | None:
    import re
    found = re.search(r"\d+(?:\.\d+)?", text or "")
    return float(found.group()) if found else None


def _history(project: Project) -> tuple[list[tuple[int, float]], list[tuple[int, float]], float | None]:
    """(train cos by step, val cos by step, the wall seconds from the first to the last logged step)."""
    train, val, times = [], [], []
    for name, key, out in (("metrics.jsonl", "cos", train), ("val.jsonl", "val_cos", val)):
        path = project.checkpoints_dir / name
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (FileNotFoundError, NotADirectoryError):
            continue
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue                          # a line a kill cut short
            if isinstance(row.get(key), (int, float)) and isinstance(row.get("step"), int):
                out.append((row["step"], float(row[key])))
            if isinstance(row.get("time"), (int, float)):
                times.append(float(row["time"]))
    return train, val, (max(times) - min(times)) if len(times) > 1 else None


def _plot(project: Project, headline: str | None, snapshots: list[dict[str, Any]],
          final: tuple[int, float] | None) -> bytes | None:
    """The quality-vs-steps PNG: train and val cos from the run's logs, each evaluated snapshot's and the export's
    judged metric; None with nothing to draw."""
    train, val, _ = _history(project)
    evals = sorted((int(e["step"]), float(e["eval"][headline])) for e in snapshots
                   if headline and isinstance((e.get("eval") or {}).get(headline), (int, float)))
    if final:
        evals = sorted({*evals, final})
    series = [(f"train cos ({len(train)} logged steps)", train, None), ("val cos", val, "o"),
              (f"eval {headline}", evals, "s")]
    series = [s for s in series if s[1]]
    if not series:
        return None
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(8, 3.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, points, marker in series:
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, markersize=6, linewidth=1.4,
                label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("cosine")
    ax.set_title(f"{project.settings.name}: quality vs steps")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    out = io.BytesIO()
    fig.savefig(out, format="png", metadata={"Software": None})      # no version stamp: same data, same bytes
    return out.getvalue()


def _hardware(project: Project) -> str:
    device = project.settings.train.device
    try:
        import torch
        if device in ("auto", "cuda") and torch.cuda.is_available() or device.startswith("cuda"):
            return f"{torch.cuda.get_device_name(0)} (CUDA), torch {torch.__version__}"
        cpu = _cpu_name()
        return f"CPU ({cpu}, {os.cpu_count()} cores), torch {torch.__version__}"
    except ImportError:
        return f"train.device {device}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _front_matter(project: Project, figures: dict[str, float], gguf: Path) -> dict[str, Any]:
    base_model, datasets = _repos(project)
    pack = project.pack
    data: dict[str, Any] = {"library_name": "gguf", "pipeline_tag": "feature-extraction",
                            "tags": list(dict.fromkeys(["gguf", "pig_clip", "ggk", "gguf-trainer", pack.id,
                                                        pack.adapter_kind, "text-encoder-adapter"])),
                            "base_model": base_model}
    if project.is_demo or mock_enabled(project):
        data["tags"].append("machinery-check")
    license_ = _teacher_license(project)
    if license_:
        data["license"] = license_
    if datasets:
        data["datasets"] = datasets
    if figures:
        data["model-index"] = [{"name": gguf.stem, "results": [{
            "task": {"type": "feature-extraction", "name": f"{pack.title}: the teacher's text-encoder rows"},
            "dataset": {"type": "prompts", "name": _prompts(project), "split": "validation"},
            "metrics": [{"type": k, "name": k, "value": v} for k, v in figures.items()]}]}]
    return data


def card_text(project: Project, gguf: Path, snapshot: dict[str, Any] | None, plot_name: str | None) -> str:
    """The whole card (front matter and body) for `gguf`."""
    import yaml
    pack, settings = project.pack, project.settings
    figures = card_figures(project, gguf, snapshot)
    mock = mock_enabled(project) or (read_contract(project, "val") or "").endswith(" mock-teacher")
    note = machinery_note(mock, project.is_demo)
    lines: list[str] = []
    if note:
        lines += [f"{MACHINERY_LINE} {note}.", ""]
    base_model, _ = _repos(project)
    which = f"snapshot of the {snapshot.get('checkpoint')} checkpoint" if snapshot else "the best checkpoint"
    best = None if snapshot else checkpoints.read_sidecar(project, checkpoints.BEST)
    kvs_steps = snapshot.get("step") if snapshot else best and best.trained_steps
    lines += [f"# {gguf.name}", "",
              f"A pig_clip adapter for the ggk engine ({pack.title}): with `{gguf.name}`, the pig_clip Qwen3 0.6B GGUF "
              f"stands in for the text encoder of {base_model[0]} (adapter kind `{pack.adapter_kind}`, "
              f"{which}, step {kvs_steps}).", ""]
    command = pack.ggk_command(project).replace(str(project.gguf_path()), str(gguf))
    lines += ["## Use it in ggk", "", "```sh", plain_command(command), "```", ""]
    if pack.ggk_edit_args:
        lines += [f"To edit images, add: `{plain_command(pack.ggk_edit_args)}`", ""]
    if pack.ggk_min_version:
        lines += [f"Needs ggk {pack.ggk_min_version} or later.", ""]
    lines += ["## Evaluation", "", f"Verdict: {_verdict(project, figures, note)}", ""]
    if figures:
        lines += [f"- {line}" for line in eval_lines(pack.judge, figures, [k for k in pack.metric_names
                                                                          if k != "roundtrip_cos"], False)]
        lines += [f"- roundtrip_cos {figures['roundtrip_cos']:.5f} (the GGUF against its checkpoint; ≥ 0.999 when "
                  "the export is right)"] if "roundtrip_cos" in figures else []
        lines += ["", f"Scored on {_prompts(project)}.", ""]
    if plot_name:
        lines += [f"![quality vs steps]({plot_name})", ""]
    _, _, wall = _history(project)
    train = settings.train.flat()
    lines += ["## Training", "",
              f"- steps: {kvs_steps} of {settings.train.steps} planned",
              f"- training wall time: {_duration(wall)} (first to last logged step)" if wall else "- wall time: –",
              f"- hardware: {_hardware(project)}",
              f"- trainer: gguf-trainer {__version__}, pack `{pack.id}`",
              f"- shard CONTRACT: `{read_contract(project, 'train') or read_contract(project, 'val') or '–'}`",
              f"- corpus: {settings.corpus.n_train} train / {settings.corpus.n_val} validation samples", "",
              "| setting | value |", "| --- | --- |",
              *(f"| train.{k} | {v} |" for k, v in train.items()), ""]
    snaps = _snapshots(project)
    if snaps:
        lines += ["## Snapshots", "", "| step | checkpoint | val cos | file |", "| --- | --- | --- | --- |",
                  *(f"| {e.get('step')} | {e.get('checkpoint')} | {_num(e.get('val_cos'))} | {e.get('name')} |"
                    for e in snaps), ""]
    lines += [f"Written by gguf-trainer {__version__} on {time.strftime('%Y-%m-%d', time.gmtime())}."]
    front = yaml.safe_dump(_front_matter(project, figures, gguf), sort_keys=False, allow_unicode=True)
    return f"---\n{front}---\n\n" + "\n".join(lines) + "\n"


def _num(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, (int, float)) else "–"


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s" if m else f"{seconds:.1f} s"


def write_card(project: Project) -> Path | None:
    """(Re)write the card and its plot beside the described export, atomically; None when nothing is exported."""
    found = described_file(project)
    if found is None:
        return None
    gguf, snapshot = found
    figures = card_figures(project, gguf, snapshot)
    headline = next(iter(figures), None)
    scored_at = read_json(project.eval_json, {}).get("trained_steps") if headline and snapshot is None else None
    final = (int(scored_at), figures[headline]) if isinstance(scored_at, int) else None     # the export's eval point
    png = _plot(project, headline, _snapshots(project), final)
    plot = project.card_plot_path()
    if png is not None:
        with atomic_path(plot, needs=len(png)) as tmp:
            tmp.write_bytes(png)
    card = project.card_path()
    atomic_write_text(card, card_text(project, gguf, snapshot, plot.name if png is not None else None))
    return card
