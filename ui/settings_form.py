"""The settings form of the Setup tab, generated from the settings dataclasses: one field per
setting, with the pack's defaults, saved through `Project.update_settings` (the same
validation as the CLI) and every problem shown on its own field."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import gradio as gr

from trainer_core.base.config import SECTIONS, ConfigError, PackSetting, Settings, own_fields, pack_settings_of
from trainer_core.contract.corpus_kinds import IMAGE, TEXT
from trainer_core.packs import PACKS
from trainer_core.project import Project

__all__ = ["FormField", "FIELDS", "build_fields", "form_values", "form_assignments", "problem_updates",
           "KIND_ONLY", "SECTION_TITLES"]

SECTION_TITLES = {"corpus": "Corpus", "precompute": "Precompute", "train": "Training", "export": "Output"}
# the corpus settings one corpus kind reads and another does not (contract/corpus_kinds.py)
KIND_ONLY = {name for kind in (TEXT, IMAGE) for name in kind.settings}
# the settings packs declare (LLaDA: export.export_sigvq): one field each, shown for the packs that have it
PACK_SETTINGS: dict[str, PackSetting] = {s.key: s for pack in PACKS.values() for s in pack.settings}
PACK_ONLY = set(PACK_SETTINGS)


@dataclass(frozen=True)
class FormField:
    key: str                 # "train.steps", or "name" for top-level settings
    label: str
    kind: str                # "bool" | "choice" | "subset" | "list" | "text"
    options: tuple[str, ...]
    help: str

    @property
    def section(self) -> str:
        return self.key.split(".")[0] if "." in self.key else ""


def _field(key: str, value: Any, parse: Any, help: str) -> FormField:
    options = tuple(getattr(parse, "options", ()))
    if isinstance(value, bool):
        kind = "bool"
    elif options and isinstance(value, list):
        kind = "subset"
    elif options:
        kind = "choice"
    elif isinstance(value, list):
        kind = "list"
    else:
        kind = "text"
    return FormField(key, key.split(".")[-1].replace("_", " "), kind, options, help)


def _fields() -> list[FormField]:
    out = [FormField("name", "Adapter name", "text", (), "the exported file is <name>-f16.gguf"),
           FormField("auto_resume", "Resume automatically after a reboot (gguf-trainer --auto-resume)", "bool", (), "")]
    for section, cls in SECTIONS.items():
        defaults = cls()
        for f in own_fields(cls):
            out.append(_field(f"{section}.{f.name}", getattr(defaults, f.name), f.metadata.get("parse"),
                              f.metadata.get("help", "")))
        out += [_field(s.key, s.default, s.parse, s.help) for s in PACK_SETTINGS.values() if s.section == section]
    return out


FIELDS: tuple[FormField, ...] = tuple(_fields())


def build_fields() -> dict[str, gr.components.Component]:
    """The components, in FIELDS order, inside one accordion per section (call inside Blocks)."""
    comps: dict[str, gr.components.Component] = {}
    for field in FIELDS[:2]:
        comps[field.key] = _component(field)
    for section in SECTIONS:
        with gr.Accordion(SECTION_TITLES[section], open=section in ("corpus", "train")):
            with gr.Row(equal_height=False):
                col = 0
                columns = [gr.Column(min_width=240) for _ in range(3)]
                for field in FIELDS:
                    if field.section != section:
                        continue
                    with columns[col % 3]:
                        comps[field.key] = _component(field)
                    col += 1
    return comps


def _component(field: FormField) -> gr.components.Component:
    elem_id = "set-" + field.key.replace(".", "-").replace("_", "-")
    if field.kind == "bool":
        return gr.Checkbox(label=field.label, info=field.help or None, elem_id=elem_id)
    if field.kind == "choice":
        return gr.Dropdown(list(field.options), label=field.label, info=field.help or None, elem_id=elem_id)
    if field.kind == "subset":
        return gr.CheckboxGroup(list(field.options), label=field.label, info=field.help or None, elem_id=elem_id)
    return gr.Textbox(label=field.label, info=field.help or None, elem_id=elem_id, max_lines=1)


def _value_of(settings: Settings, key: str) -> Any:
    """The setting's value; a setting of another pack than the project's (a hidden field) shows its default."""
    obj: Any = settings
    try:
        for part in key.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        if key in PACK_SETTINGS:
            return PACK_SETTINGS[key].default
        raise
    return obj


def _shown(field: FormField, value: Any) -> Any:
    if field.kind in ("bool", "choice", "subset"):
        return value
    if field.kind == "list":
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def form_values(project: Project) -> list[Any]:
    """The form's values for the project, in FIELDS order."""
    return [_shown(f, _value_of(project.settings, f.key)) for f in FIELDS]


def form_assignments(project: Project, values: list[Any]) -> list[str]:
    """`key=value` for every field whose value differs from the saved settings."""
    out = []
    for field, value in zip(FIELDS, values):
        current = _shown(field, _value_of(project.settings, field.key))
        if value == current or (value is None and field.kind != "bool"):
            continue
        if field.kind == "bool":
            text = "true" if value else "false"
        elif field.kind == "subset":
            text = json.dumps(list(value or []))
        else:
            text = str(value).strip()
        out.append(f"{field.key}={text}")
    return out


def problem_updates(error: ConfigError | None) -> list[Any]:
    """One update per field: the problem that names it in its info line, else its help."""
    problems = list(error.problems) if error else []
    updates = []
    for field in FIELDS:
        mine = [p for p in problems if p.startswith(field.key + " ") or p.startswith(f'"{field.key}')
                or p.startswith(f"{field.key} (")]
        info = ("⚠ " + "; ".join(mine)) if mine else (field.help or None)
        updates.append(gr.update(info=info))
    return updates


def visibility_updates(project: Project) -> list[Any]:
    """The corpus fields of the pack's corpus kind (the others hidden); the SigVQ export and the teacher
    placement on LLaDA, the teacher mode on the others."""
    kind, own = project.pack.corpus_kind.settings, pack_settings_of(project.pack)
    updates = []
    for field in FIELDS:
        name = field.key.split(".")[-1]
        if field.section == "corpus" and name in KIND_ONLY:
            updates.append(gr.update(visible=name in kind))
        elif field.key in PACK_ONLY:                                           # one pack's own setting
            updates.append(gr.update(visible=field.key in own))
        elif field.key in ("precompute.placement", "precompute.teacher_mode"):   # the pack's own control
            updates.append(gr.update(visible=field.key.endswith(project.pack.teacher_control)))
        else:
            updates.append(gr.update())
    return updates
