"""The Setup tab's demo button and its "afresh" confirm: build and start the pack's demo, open one that exists
(resume it when unfinished, offer to start it afresh when done), rebuild it from nothing on request."""
from __future__ import annotations

import glob
import queue
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterator

from trainer_core.base.errors import TrainerError
from trainer_core.packs import DEMO_PACKS, get_pack
from trainer_core.project import Project, folder_is_project
from trainer_core.runner import runtime_status
from trainer_core.stages import STAGE_NAMES, stage_wanted

from ui.action_banner import RUN
from ui.context import Ctx
from ui.paths import PathRefused, os_error_sentence
from ui.project_view import AFRESH_LABEL, ProjectView, _opened, current_view

__all__ = ["run_demo", "restart_demo", "demo_steps", "BUILDING"]

BUILDING = "Building the demo"        # the banner's words while it is built, before each step's name

Progress = Callable[[int, int, str], None]


def _how_long(pack_id: str) -> str:
    """The measured run time (trainer_core/demo_times.json), or where to follow the run when none is measured."""
    from trainer_core.demo_times import run_time_sentence
    return run_time_sentence(pack_id) or "follow it on the Train tab"


def _stages_left(project: Project) -> list[str]:
    """The stages a run would still do (the ones a run of the demo would not skip)."""
    return [name for name in STAGE_NAMES if stage_wanted(project, name)]


def demo_steps(action: Callable[[Progress], tuple]) -> Iterator[tuple]:
    """The demo buttons' answers as they come: `action(progress)` (run_demo or restart_demo) runs in a thread
    while each step of a build it reports is shown as it starts, in the banner alone ("Building the demo (2/5):
    the student GGUF…"), then its own answer. The build's first step is said before torch is imported: the
    banner speaks within a second of the click, not after the 10–15 s a first build takes."""
    steps: queue.Queue = queue.Queue()
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["view"] = action(lambda done, total, what: steps.put((done, total, what)))
        except BaseException as e:          # a bug: raised in the handler below, as Gradio would show it
            outcome["error"] = e
        finally:
            steps.put(None)
    threading.Thread(target=work, name="demo-build", daemon=True).start()
    while (step := steps.get()) is not None:
        done, total, what = step
        yield ProjectView.banner_only(f"{BUILDING} ({done}/{total}): {what}…", "notice")
    if "error" in outcome:
        raise outcome["error"]       # type: ignore[misc]
    yield outcome["view"]


def run_demo(ctx: Ctx, pack_id: str = DEMO_PACKS[0], current: str | None = None,
             progress: Progress | None = None) -> tuple:
    """The demo button: build the pack's demo project under the demo folder and start it. A demo that
    exists is opened: running, it is left alone; unfinished, it is resumed (its finished stages are
    kept); complete, nothing starts and the "afresh" confirm (`restart_demo`) is offered. Refused,
    the project open now (`current`) stays open. `progress` hears the build's steps (demo_steps)."""
    from trainer_core.demo import build_demo
    offer, kind, wait = False, "ok", RUN           # a started run: its banner gives way to its outcome
    try:
        pack = get_pack(pack_id)
        root = ctx.demo_root / pack.default_folder
        built = not folder_is_project(root)
        project = build_demo(root, pack.id, progress) if built else Project.open(root)
        _opened(ctx, project)
        status = runtime_status(project)["status"]
        left = [] if built or status == "running" else _stages_left(project)
        if status == "running":
            message, kind = "The demo is already running; follow it on the Train tab.", "notice"
        elif built:
            pid = ctx.supervisor.start_run(project.root)
            message = f"Demo started (pid {pid}): tiny offline models, every stage; {_how_long(pack.id)}."
        elif not left:
            offer, kind, wait = True, "notice", None
            message = (f"The demo is already done: every stage has run, and it is open now ({project.root}; its "
                       f"GGUF is on the Output tab). Nothing was started. To run it again from nothing, press "
                       f"“{AFRESH_LABEL}”.")
        else:
            pid = ctx.supervisor.start_run(project.root)
            kept = [name for name in STAGE_NAMES if name not in left]
            message = (f"The demo was unfinished ({status}): resumed it (pid {pid})"
                       + (f", keeping its finished stages ({', '.join(kept)})" if kept else "")
                       + f"; left to run: {', '.join(left)}. Follow it on the Train tab.")
    except TrainerError as e:
        return current_view(ctx, current, str(e))
    except OSError as e:                     # the demo folder unreadable or unwritable: one sentence
        return current_view(ctx, current, os_error_sentence(e, "demo folder"))
    return ProjectView.of(ctx, project, message, kind, offer_afresh=offer, wait=wait)


def _demo_outputs(project: Project, demo_root: Path) -> list[Path]:
    """What the demo's runs wrote beside its folder (the export, its snapshots, a pack's extra files),
    where that is the demo folder: the files a rebuild removes with the project."""
    out = project.output_dir()
    found = [project.gguf_path(), *project.pack.extras.outputs(project),
             *out.glob(glob.escape(project.settings.name) + "-step*-f16.gguf")]
    return [p for p in found if p.is_file() and p.resolve().parent == demo_root]


def restart_demo(ctx: Ctx, current: str | None, progress: Progress | None = None) -> tuple:
    """The "afresh" confirm: delete the open demo's folder (and its exports beside it), build the demo
    again from nothing as the demo button does the first time (`progress` hears its steps), and start it."""
    from trainer_core.demo import build_demo
    from trainer_core.materials import is_demo
    if not current:
        return ProjectView.of(ctx, None, "Press Try the demo first.", "error")
    try:
        root = ctx.paths.check(current, "project folder")
        project = Project.open(root)
        demo_root = ctx.demo_root.resolve()
        if not is_demo(project) or root.parent != demo_root or root.name != project.pack.default_folder:
            raise PathRefused(f"{root} is not the demo project of this app; only a demo under {demo_root} can be "
                              f"started afresh.")
        if runtime_status(project)["status"] == "running":
            raise PathRefused("The demo is running; stop it on the Train tab first, then start it afresh.")
        pack_id = project.pack.id
        ctx.supervisor.detach(root)          # its view reads the new folder from the start
        for path in _demo_outputs(project, demo_root):
            path.unlink()
        shutil.rmtree(root)
    except (PathRefused, TrainerError) as e:
        return current_view(ctx, current, str(e))
    except OSError as e:
        return current_view(ctx, current, os_error_sentence(e, "demo folder"))
    try:
        project = build_demo(root, pack_id, progress)
        _opened(ctx, project)
        pid = ctx.supervisor.start_run(project.root)
    except (TrainerError, OSError) as e:
        why = os_error_sentence(e, "demo folder") if isinstance(e, OSError) else str(e)
        ctx.remember_project(None)
        return ProjectView.of(ctx, None, f"The old demo was deleted, but rebuilding it failed: {why} "
                                      f"Press Try the demo to build it again.", "error")
    return ProjectView.of(ctx, project, f"Rebuilt the demo from nothing and started it (pid {pid}): every stage "
                                     f"runs again; {_how_long(pack_id)}.", "ok", wait=RUN)
