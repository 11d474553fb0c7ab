"""Typed project settings: one dataclass per `project.json` section, defaults, validation.

Layers, bottom up: the built-in defaults below, the settings the project's pack declares
(`PackSetting`: a pack's own settings, with their parser, default and help — the sections below hold
only what every pack reads), the pack's `defaults` overlay (applied at creation and again at load, so
a key added in a later version gets the pack's value), then the file. A key another pack declares is
dropped when a file is read (a project.json written before the pack changed, or by an older version
that kept every pack's settings), and refused when it is set. This module knows no pack registry: the
caller hands it the packs (config.PackInfo); `trainer_core.project` binds the registry and is what
the rest of the code calls. Validation collects every problem before
raising one `ConfigError`, each problem
naming the key the user sees: `train.steps must be a positive whole number, got "abc"`.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from trainer_core.base.errors import ConfigError
from trainer_core.base.parsers import PackInfo, parse_count
from trainer_core.base.parsers import area_weights as _area_weights
from trainer_core.base.parsers import boolean as _boolean
from trainer_core.base.parsers import choice as _choice
from trainer_core.base.parsers import count as _count
from trainer_core.base.parsers import device as _device
from trainer_core.base.parsers import name as _name
from trainer_core.base.parsers import number as _number
from trainer_core.base.parsers import pack_id as _pack_id
from trainer_core.base.parsers import subset as _subset
from trainer_core.base.parsers import text as _text
from trainer_core.base.parsers import text_list as _text_list

__all__ = [
    "PackSetting", "pack_setting", "pack_settings_of", "own_fields", "flat_settings",
    "CorpusSettings", "PrecomputeSettings", "TrainSettings", "ExportSettings",
    "MaterialOverride", "Settings", "PROMPT_PRESETS", "IMAGE_PRESETS", "SECTIONS",
    "parse_count", "default_settings_dict", "settings_from_dict", "deep_merge",
    "apply_assignments", "parse_assignment", "PackInfo",
]


PROMPT_PRESETS = ("gustavosta", "midjourney", "diffusiondb", "vidprom")
IMAGE_PRESETS = ("flickr30k", "coco_captions")

def _setting(default: Any, parse: Callable[[Any], Any], help: str = "") -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default),
                     metadata={"parse": parse, "help": help})
    return field(default=default, metadata={"parse": parse, "help": help})


MAX_BATCH = 65536     # samples a training batch: far past any card's memory, and a typo's 10⁸ is refused at `set`


@dataclass(frozen=True)
class PackSetting:
    """A setting one pack declares (packs/base.TrainerPack.settings): `key` is "section.name"."""

    key: str
    default: Any
    parse: Callable[[Any], Any]
    help: str = ""

    @property
    def section(self) -> str:
        return self.key.partition(".")[0]

    @property
    def name(self) -> str:
        return self.key.partition(".")[2]


def pack_setting(key: str, default: Any, parse: Callable[[Any], Any], help: str = "") -> PackSetting:
    section, dot, name = key.partition(".")
    if not dot or section not in ("corpus", "precompute", "train", "export") or not name:
        raise ValueError(f"a pack setting's key is section.name with a section of project.json, got {key!r}")
    return PackSetting(key, copy.deepcopy(default), parse, help)


def pack_settings_of(pack: Any) -> dict[str, PackSetting]:
    """key → PackSetting of what `pack` declares (none for a pack without `settings`)."""
    return {s.key: s for s in getattr(pack, "settings", ())}


def own_fields(cls: type) -> list[dataclasses.Field]:
    """A section's own settings (the dataclass fields but `pack_values`)."""
    return [f for f in dataclasses.fields(cls) if f.name != "pack_values"]


class _Section:
    """A settings section: its own fields, plus the values of the settings the project's pack declares
    in this section (`pack_values`), read as attributes like the others."""

    def flat(self) -> dict[str, Any]:
        """The section as project.json holds it: its own settings and its pack's, side by side (not copied)."""
        return {**{f.name: getattr(self, f.name) for f in own_fields(type(self))}, **self.__dict__["pack_values"]}

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("pack_values") or {}
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no setting {name!r} (neither its own nor one the "
                             f"project's pack declares)")


# ---------------------------------------------------------------- sections

@dataclass
class CorpusSettings(_Section):
    mode: str = _setting("presets", _choice("presets", "files"),
                         "presets: public prompt datasets plus local files; files: your own train/val files")
    presets: list = _setting(["gustavosta", "midjourney"], _subset(*PROMPT_PRESETS))
    extra_files: list = _setting([], _text_list, "local .txt (one prompt a line) or .jsonl (a text field)")
    train_file: str = _setting("", _text)
    val_file: str = _setting("", _text)
    n_train: int = _setting(60000, _count())
    n_val: int = _setting(1024, _count())
    empty_frac: float = _setting(0.01, _number(0.0, 0.5), "fraction of empty prompts injected")
    min_chars: int = _setting(8, _count(0))
    max_chars: int = _setting(1200, _count())
    seed: int = _setting(8, _count(0))
    image_presets: list = _setting([], _subset(*IMAGE_PRESETS))
    image_folders: list = _setting([], _text_list)
    n_image: int = _setting(56000, _count(0))
    n_two: int = _setting(3000, _count(0))
    n_text: int = _setting(27000, _count(0))
    n_val_image: int = _setting(1024, _count(0))
    n_val_text: int = _setting(512, _count(0))
    ref_areas: list = _setting([[147456, 0.35], [262144, 0.35], [589824, 0.20], [1048576, 0.10]],
                               _area_weights)
    two_image_max_area: int = _setting(262144, _count())
    pack_values: dict = field(default_factory=dict, repr=False)     # the pack's own settings (PackSetting)


@dataclass
class PrecomputeSettings(_Section):
    device: str = _setting("auto", _device)
    gpus: int = _setting(1, _count(1), "processes, one per GPU (torchrun); on a machine without CUDA, CPU "
                                       "processes. Other machines sharing the project can add ranks by hand")
    placement: str = _setting("sequential", _choice("sequential", "balanced"),
                              "sequential: the chosen GPU, the other GPUs, then CPU RAM; balanced: an even "
                              "split, about half the throughput")
    shard_size: int = _setting(1024, _count())
    val_shard_size: int = _setting(512, _count())
    teacher_batch: int = _setting(24, _count(0), "0 = chosen for the card")
    tok_budget: int = _setting(12288, _count(0), "0 = chosen for the card")
    student_batch: int = _setting(64, _count(0), "0 = chosen for the card")
    student_tok_budget: int = _setting(0, _count(0), "0 = chosen for the card")
    vis_tok_budget: int = _setting(0, _count(0), "0 = chosen for the card")
    teacher_mode: str = _setting("auto", _choice("auto", "gpu", "offload"))
    gpu_mem_gib: float = _setting(0.0, _number(0.0), "0 = the card's total minus 1.5 GiB")
    cpu_mem_gib: float = _setting(0.0, _number(0.0), "0 = available RAM minus 6 GiB (at least 4)")
    student_dtype: str = _setting("bf16", _choice("bf16", "f16", "f32"))
    mock_teacher: bool = _setting(False, _boolean, "synthetic targets: a smoke test, never a usable adapter")
    pack_values: dict = field(default_factory=dict, repr=False)     # the pack's own settings (PackSetting)


@dataclass
class TrainSettings(_Section):
    device: str = _setting("auto", _device)
    gpus: int = _setting(1, _count(1), "DDP over this many processes (one per GPU); 1 trains in one process")
    compile: str = _setting("auto", _choice("auto", "on", "off"),
                            "torch.compile the training step (auto: on CUDA, where it measured +26–42 %)")
    width: int = _setting(1024, _count(64, multiple_of=64), "a multiple of 64 (head_dim is 64)")
    depth: int = _setting(6, _count())
    steps: int = _setting(20000, _count(maximum=10_000_000), "the planned step count, at most 10M; can change any time")
    batch_size: int = _setting(32, _count(maximum=MAX_BATCH))
    lr: float = _setting(2e-4, _number(0.0, low_open=True))
    warmup: int = _setting(1000, _count(0))
    weight_decay: float = _setting(0.01, _number(0.0))
    grad_clip: float = _setting(1.0, _number(0.0), "0 = no clipping")
    cos_weight: float = _setting(0.5, _number(0.0))
    sigma_floor: float = _setting(0.03, _number(0.0), "σ floor; layerwise packs: × each tap's median σ")
    grad_checkpoint: str = _setting("auto", _choice("auto", "on", "off"),
                                    "recompute activations in the backward pass: less memory, up to 1.35× the time; "
                                    "auto = on for the Qwen3.5 bridge on a GPU")
    batch_tokens: int = _setting(0, _count(0), "micro-batch token budget; 0 = whole batch at once")
    log_every: int = _setting(25, _count())
    val_every: int = _setting(500, _count())
    save_every: int = _setting(250, _count())
    history: bool = _setting(False, _boolean, "keep weights-only copies of chosen steps")
    history_every: int = _setting(500, _count(0))
    history_from: int = _setting(0, _count(0))
    history_to: int = _setting(0, _count(0))
    history_keep: int = _setting(0, _count(0))
    seed: int = _setting(42, _count(0))
    pack_values: dict = field(default_factory=dict, repr=False)     # the pack's own settings (PackSetting)


@dataclass
class ExportSettings(_Section):
    output_dir: str = _setting("", _text, "empty = the folder that holds the project folder")
    copy_to: str = _setting("", _text, "optional second destination, e.g. your ggk model folder")
    run_eval: bool = _setting(True, _boolean)
    pack_values: dict = field(default_factory=dict, repr=False)     # the pack's own settings (PackSetting)


@dataclass
class MaterialOverride:
    path: str = _setting("", _text)


SECTIONS: dict[str, type] = {
    "corpus": CorpusSettings,
    "precompute": PrecomputeSettings,
    "train": TrainSettings,
    "export": ExportSettings,
}
_TOP_LEVEL = {"pack": _text, "name": _name, "auto_resume": _boolean, "hf_token": _text}


@dataclass
class Settings:
    """The whole `project.json`."""

    # no pack here: a project's pack and adapter name come from the pack it is created with (the registry's
    # default pack when project.json names none), see default_settings_dict
    pack: str = ""
    name: str = "pig_adapter"
    auto_resume: bool = True
    hf_token: str = field(default="", repr=False)   # a secret: in .hf_token (token_store.py), not project.json
    materials: dict = field(default_factory=dict)   # material id -> MaterialOverride
    corpus: CorpusSettings = field(default_factory=CorpusSettings)
    precompute: PrecomputeSettings = field(default_factory=PrecomputeSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    export: ExportSettings = field(default_factory=ExportSettings)

    def to_dict(self) -> dict:
        """project.json's shape: a pack's own settings sit in their section beside the others."""
        out = dataclasses.asdict(self)
        for section in SECTIONS:
            out[section].update(out[section].pop("pack_values", {}))
        return out


# ---------------------------------------------------------------- building and validating

def deep_merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`; nested dicts merge, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def default_settings_dict(pack: PackInfo) -> dict:
    """Built-in defaults with the pack's overlay: what a new project of that pack starts from."""
    base = Settings().to_dict()
    for setting in pack_settings_of(pack).values():
        base[setting.section][setting.name] = copy.deepcopy(setting.default)
    merged = deep_merge(base, dict(pack.defaults))
    merged["pack"] = pack.id
    merged["name"] = "pig_" + pack.default_folder       # the adapter name a project in the pack's folder gets
    return merged


def _got(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _unknown(key: str, known: list[str]) -> str:
    prefix, _, leaf = key.rpartition(".")
    close = difflib.get_close_matches(leaf, known, n=1)
    hint = f' (did you mean "{prefix + "." if prefix else ""}{close[0]}"?)' if close else ""
    return f'"{key}" is not a setting{hint}'


def _parse_section(cls: type, raw: Any, prefix: str, problems: list[str],
                   declared: Mapping[str, PackSetting] | None = None, others: frozenset[str] = frozenset()) -> Any:
    """The section `prefix` of project.json: its own settings and those the pack declares in it (`declared`:
    key → PackSetting); a key only other packs declare (`others`) is dropped, any other unknown key is a
    problem."""
    if not isinstance(raw, dict):
        problems.append(f"{prefix} must be a JSON object of settings, got {_got(raw)}")
        return cls()
    fields = {f.name: f for f in own_fields(cls)}
    mine = {s.name: s for s in (declared or {}).values() if s.section == prefix}
    values: dict[str, Any] = {}
    pack_values: dict[str, Any] = {}
    for key, value in raw.items():
        spec = fields.get(key)
        if spec is None and key in mine:
            try:
                pack_values[key] = mine[key].parse(value)
            except ValueError as e:
                problems.append(f"{prefix}.{key} {e}, got {_got(value)}")
            continue
        if spec is None:
            if f"{prefix}.{key}" not in others:
                problems.append(_unknown(f"{prefix}.{key}", [*fields, *mine]))
            continue
        try:
            values[key] = spec.metadata["parse"](value)
        except ValueError as e:
            problems.append(f"{prefix}.{key} {e}, got {_got(value)}")
    for name, setting in mine.items():
        pack_values.setdefault(name, copy.deepcopy(setting.default))
    if "pack_values" in {f.name for f in dataclasses.fields(cls)}:
        values["pack_values"] = pack_values
    return cls(**values)


def _declared_elsewhere(packs: Mapping[str, PackInfo], pack: PackInfo) -> frozenset[str]:
    """The keys other packs declare and this one does not."""
    mine = pack_settings_of(pack)
    return frozenset(key for other in packs.values() for key in pack_settings_of(other) if key not in mine)


def _cross_checks(s: Settings, pack: PackInfo, problems: list[str]) -> None:
    c = s.corpus
    if c.min_chars > c.max_chars:
        problems.append(f"corpus.min_chars ({c.min_chars}) must not exceed corpus.max_chars ({c.max_chars})")
    if c.mode == "files" and pack.corpus_kind.reference_images:
        problems.append('corpus.mode "files" is for text packs; image packs read data/train.jsonl and data/val.jsonl')
    elif c.mode == "files" and not (c.train_file and c.val_file):
        problems.append('corpus.mode "files" needs both corpus.train_file and corpus.val_file; set them '
                        'together with the mode')


def settings_from_dict(raw: Any, packs: Mapping[str, PackInfo], default_pack: str) -> Settings:
    """Validate a project.json object (merged over the defaults of its pack) into Settings."""
    if not isinstance(raw, dict):
        raise ConfigError([f"project.json must hold a JSON object of settings, got {_got(raw)}"])
    pack_id = raw.get("pack", default_pack)
    pack = packs[pack_id] if isinstance(pack_id, str) and pack_id in packs else packs[default_pack]
    merged = deep_merge(default_settings_dict(pack), raw)
    parsers = {**_TOP_LEVEL, "pack": _pack_id(packs)}
    problems: list[str] = []
    top = {}
    for key, value in merged.items():
        if key in SECTIONS:
            top[key] = _parse_section(SECTIONS[key], value, key, problems, pack_settings_of(pack),
                                      _declared_elsewhere(packs, pack))
        elif key == "materials":
            top[key] = _parse_materials(value, problems)
        elif key in parsers:
            try:
                top[key] = parsers[key](value)
            except ValueError as e:
                problems.append(f"{key} {e}, got {_got(value)}")
        else:
            problems.append(_unknown(key, [*SECTIONS, *_TOP_LEVEL, "materials"]))
    settings = Settings(**top)
    if not problems:
        _cross_checks(settings, pack, problems)
    if problems:
        raise ConfigError(problems)
    return settings


def _parse_materials(raw: Any, problems: list[str]) -> dict:
    if not isinstance(raw, dict):
        problems.append(f"materials must be a JSON object of material ids, got {_got(raw)}")
        return {}
    out = {}
    for mat_id, value in raw.items():
        out[mat_id] = _parse_section(MaterialOverride, value, f"materials.{mat_id}", problems)
    return out


# ---------------------------------------------------------------- key=value assignments

def parse_assignment(text: str) -> tuple[list[str], str]:
    """`train.steps=12k` -> (["train", "steps"], "12k")."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError([f'"{text}" is not a setting assignment; write it as key=value, e.g. train.steps=12k'])
    return key.split("."), value


def apply_assignments(raw: dict, assignments: list[str], packs: Mapping[str, PackInfo], default_pack: str
                      ) -> tuple[dict, Settings]:
    """Set each `key=value` in a copy of `raw`, validate the result, return (dict, Settings).

    Values arrive as text and are parsed by the setting's own parser, so `train.steps=12k`,
    `export.run_eval=false` and `corpus.presets=gustavosta,vidprom` all work. Every problem
    (unknown keys included) is reported at once.
    """
    out = copy.deepcopy(raw)
    problems: list[str] = []
    given = [t.partition("=")[2].strip() for t in assignments if t.partition("=")[0].strip() == "pack"]
    pack_id = given[-1] if given else out.get("pack", default_pack)     # the pack these settings are read for
    pack = packs[pack_id] if isinstance(pack_id, str) and pack_id in packs else packs[default_pack]
    declared = pack_settings_of(pack)
    known_sections = {name: [f.name for f in own_fields(cls)] + [s.name for s in declared.values() if s.section == name]
                      for name, cls in SECTIONS.items()}
    for text in assignments:
        try:
            path, value = parse_assignment(text)
        except ConfigError as e:
            problems.extend(e.problems)
            continue
        key = ".".join(path)
        owners = [p.title for p in packs.values() if key in pack_settings_of(p)]
        if len(path) == 1 and path[0] in _TOP_LEVEL:
            out[path[0]] = value
        elif len(path) == 2 and path[0] in known_sections and path[1] in known_sections[path[0]]:
            section = out.setdefault(path[0], {})
            if not isinstance(section, dict):
                section = out[path[0]] = {}
            section[path[1]] = value
        elif owners:
            problems.append(f"{key} is a setting of the {' and '.join(owners)} pack"
                            f"{'s' if len(owners) > 1 else ''} only; this project's pack ({pack.title}) has none")
        elif len(path) == 3 and path[0] == "materials" and path[2] == "path":
            out.setdefault("materials", {}).setdefault(path[1], {})["path"] = value
        elif len(path) == 1 and path[0] in known_sections:
            problems.append(f'"{key}" is a group of settings; set one of them, e.g. '
                            f'{key}.{known_sections[key][0]}=...')
        elif len(path) == 2 and path[0] in known_sections:
            problems.append(_unknown(key, known_sections[path[0]]))
        else:
            problems.append(_unknown(key, [*known_sections, *_TOP_LEVEL]))
    try:
        settings = settings_from_dict(out, packs, default_pack)
    except ConfigError as e:
        problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    return out, settings


def flat_settings(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"train.steps": 20000, …}: a settings dict by dotted key (an empty section kept as its own value)."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(flat_settings(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out
