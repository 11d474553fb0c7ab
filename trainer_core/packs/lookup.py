"""What the stages, the services and the packs look up about a project's pack that is not a hook: where a
material is and its JSON files, the real teacher placed by the settings, the engine's prompt strings, and the
ids the engine runs the student over. Each takes the project (whose `pack` it asks) or the pack.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_core.base.errors import ModelFileError, UsageError
from trainer_core.contract.prompt_attention import plain_text
from trainer_core.packs.declarations import IMAGE_PRESET_MATERIALS, Material

if TYPE_CHECKING:
    from trainer_core.base.folder import ProjectFolder
    from trainer_core.contract.roles import Teacher

__all__ = ["find_material", "resolve_material", "require_material", "material_json", "read_config_json",
           "teacher_material_ids", "placed_teacher", "teacher_module", "format_prompt", "teacher_prompt",
           "engine_ids"]


def find_material(pack: Any, material_id: str) -> Material:
    """The pack's material `material_id` (an image preset's too); KeyError when it has none."""
    for m in pack.materials:
        if m.id == material_id:
            return m
    if pack.corpus_kind.reference_images:
        for m in IMAGE_PRESET_MATERIALS.values():
            if m.id == material_id:
                return m
    raise KeyError(material_id)


def resolve_material(project: "ProjectFolder", material_id: str) -> Path | None:
    """Where a material lives: a path override (picked or linked), else its place under materials/
    (snapshots); None for a local file nobody picked."""
    override = project.settings.materials.get(material_id)
    if override is not None and override.path:
        return project.resolve_user_path(override.path)
    m = find_material(project.pack, material_id)
    if m.kind == "hf_snapshot":
        return project.materials_dir / (m.subdir or m.repo.rsplit("/", 1)[-1])
    return None


def require_material(project: "ProjectFolder", material_id: str) -> Path:
    """The material's path, or a UsageError saying how to provide it."""
    m = find_material(project.pack, material_id)
    path = resolve_material(project, material_id)
    if path is None:
        raise UsageError(f"The {m.title} is not set: pick {m.hint or 'the file'} in the Materials "
                         f"section, or `gguf-trainer set --project {project.root} "
                         f"--set materials.{m.id}.path=FILE`.")
    if not path.exists():
        how = (f"download it ({m.repo}) with `gguf-trainer download --project {project.root}`"
               if m.kind == "hf_snapshot" else "pick the file again")
        raise UsageError(f"The {m.title} is missing: {path} does not exist; {how}.")
    return path


def read_config_json(path: Path, repo: str, what: str = "config") -> dict[str, Any]:
    """The JSON object in a snapshot's file, or ModelFileError naming the file and the repo to download again."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"The {what} {path} is missing; download {repo} again.") from None
    except (OSError, ValueError) as e:
        raise ModelFileError(f"The {what} {path} cannot be read ({e}); download {repo} again.") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"The {what} {path} is not a JSON object; download {repo} again.")
    return data


def material_json(project: "ProjectFolder", material_id: str = "teacher", name: str = "config.json"
                  ) -> dict[str, Any] | None:
    """The JSON object `name` inside a snapshot material; None when that file is absent and the mock teacher
    stands in (the caller then takes the reference shapes); ModelFileError / UsageError saying what to do."""
    from trainer_core.contract.shards import mock_enabled
    path = resolve_material(project, material_id) / name
    if not path.is_file() and mock_enabled(project):
        return None
    path = require_material(project, material_id) / name
    return read_config_json(path, find_material(project.pack, material_id).repo or "the teacher")


def teacher_material_ids(project: "ProjectFolder") -> tuple[str, ...]:
    """The materials precompute loads as models (their weights count in the plan): those of the project's
    materials marked `model`."""
    return tuple(m.id for m in project.pack.project_materials(project) if m.model)


def teacher_module(pack: Any) -> str:
    """The module of the pack's real teacher class (its placement rule lives there); "" without one."""
    return pack.teacher_class.partition(":")[0]


def placed_teacher(project: "ProjectFolder", material_id: str, device: Any, class_path: str | None = None,
                   **options: Any) -> "Teacher":
    """The teacher class at `class_path` (the pack's `teacher_class` by default) made from the material
    `material_id` on `device`, placed by `precompute.teacher_mode` within `precompute.gpu_mem_gib`; `options`
    go to the class as they are (a family teacher's taps)."""
    module, _, name = (class_path or project.pack.teacher_class).partition(":")
    p = project.settings.precompute
    return getattr(importlib.import_module(module), name)(
        require_material(project, material_id), device=device, mode=p.teacher_mode, gpu_mem_gib=p.gpu_mem_gib,
        **options)


def format_prompt(pack: Any, text: str) -> str:
    """The engine's text-to-image string for `text` (no stripping: the engine does none)."""
    if not text and pack.t2i_empty is not None:
        return pack.t2i_empty
    return pack.t2i_template.replace("{text}", text)


def teacher_prompt(pack: Any, text: str) -> str:
    """The string a text teacher tokenizes itself: the template around the prompt as the engine's tokenizer
    reads it (the attention syntax removed; the weights scale rows after the adapter, so the target is the
    unweighted one)."""
    return format_prompt(pack, plain_text(text) if text else text)


def engine_ids(pack: Any, student: Any, text: str) -> list[int]:
    """The ids the engine's conditioner runs the student over for a text-to-image prompt (SD_DUMP_COND's
    tokens.txt), from the pack's EngineFacts: the raw prompt's or the template's pieces, then the pads."""
    facts = pack.engine
    ids = list(student.tokenize(text)) if facts and facts.raw_prompt else student.ids(pack.student_chunks(text))
    multiple = facts.pad_multiple if facts else 1
    if multiple > 1:
        ids += [facts.pad_id] * (-len(ids) % multiple)
    return ids
