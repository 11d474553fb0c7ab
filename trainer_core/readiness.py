"""Before a run launches: what would stop it that the user can fix now, said once and all at once (the
GUI's Start buttons, `start` and `run` alike), instead of a launch that stops at the first problem."""
from __future__ import annotations

from typing import TYPE_CHECKING

from trainer_core.base.errors import UsageError
from trainer_core.materials import all_statuses
from trainer_core.packs.lookup import find_material, teacher_material_ids
from trainer_core.student_hub import STUDENT_ID

if TYPE_CHECKING:
    from trainer_core.project import Project

__all__ = ["launch_problems", "refuse_unready"]


def launch_problems(project: "Project", only: list[str] | None = None) -> list[str]:
    """What a run of the stages `only` (None: all) would stop on for want of materials, checked once before
    it launches (offline, from the disk): one line per required material that is not ready, with the
    command or button that provides it; none when no precompute stage is left to run (the others read the
    shards). The teacher is not needed while the mock teacher stands in. The GUI's Start buttons, `start`
    and `run` say the same lines."""
    from trainer_core.contract.shards import mock_enabled
    from trainer_core.stages import STAGE_NAMES, stage_done
    if not any(name.startswith("precompute") and (not only or name in only) and not stage_done(project, name)
               for name in STAGE_NAMES):
        return []
    mocked = set(teacher_material_ids(project)) if mock_enabled(project) else set()
    lines = []
    for st in all_statuses(project, online=False):
        if not st.required or st.id in mocked or st.status in ("ready", "not needed"):
            continue
        material = find_material(project.pack, st.id)
        if material.kind == "hf_snapshot":
            state = {"downloading": "is still downloading", "partial": "is partly downloaded"}.get(
                st.status, f"is not downloaded ({st.path})")
            fix = (f"the Download button in the Materials section, or `gguf-trainer download --project "
                   f"{project.root}`")
        else:
            state = "is not set" if st.path is None else f"is missing ({st.path} does not exist)"
            link = f"`gguf-trainer set --project {project.root} --set materials.{st.id}.path=FILE`"
            fix = f"pick it in the Materials section, or {link}"
            if st.id == STUDENT_ID:         # no fixed repo: the Hub's search finds it (student_hub.py)
                fix = (f"Find on the Hub in the Materials section, or `gguf-trainer download --project {project.root} "
                       f"--find-student`; a file you have: {link}")
        lines.append(f"{st.title} {state}: {fix}")
    return lines


def refuse_unready(project: "Project", only: list[str] | None) -> None:
    """UsageError (exit 2) before a CLI run launches: the project folder not writable (its one sentence), or
    every missing material, one line each."""
    from trainer_core.base.diskspace import ensure_writable
    ensure_writable(project.root)
    lines = launch_problems(project, only)
    if lines:
        raise UsageError(f"Not started: this run needs {len(lines)} material{'s' if len(lines) > 1 else ''} "
                         "first:\n  " + "\n  ".join(lines))
