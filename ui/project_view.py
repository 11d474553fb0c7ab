"""What the Setup tab shows of the project open now, shared by its handlers (ui/setup_tab.py) and the
demo buttons (ui/demo_flow.py): the outputs every project-changing handler returns (`ProjectView`),
the view a refused action returns (`current_view`), and what opening a project does (`_opened`)."""
from __future__ import annotations

import gradio as gr

from trainer_core.base.config import ConfigError
from trainer_core.base.errors import TrainerError
from trainer_core.materials import all_statuses
from trainer_core.plan import shard_disk_estimate
from trainer_core.project import Project, remember_last_project
from trainer_core.runner import runtime_status
from trainer_core.from_adapter import describe_start

from ui import materials_panel
from ui.common import banner, fmt_size
from ui.context import Ctx
from ui.paths import PathRefused
from ui.plan_panel import plan_markdown
from ui.settings_form import FIELDS, form_values, problem_updates, visibility_updates

__all__ = ["ProjectView", "current_view", "disk_estimate", "start_label", "AFRESH_LABEL", "NO_PROJECT_NOTE"]

AFRESH_LABEL = "Start the demo afresh (deletes its run)"
NO_PROJECT_NOTE = ("**No project open.** Open a project folder above, create one under **+ New project**, or press "
                   "**Try the demo**: its settings appear here.")


def disk_estimate(project: Project) -> str:
    """The shards' disk use, as the Setup tab says it (plan.shard_disk_estimate)."""
    est = shard_disk_estimate(project)
    if est["per_sample"] is None:
        return (f"Shards on disk: estimated after the first shard, for {est['samples']} samples, under "
                f"{project.root / 'shards'}")
    return (f"Shards on disk: ≈ {fmt_size(int(est['total']))} for {est['samples']} samples "
            f"({fmt_size(int(est['per_sample']))} each, {est['source']}), under {project.root / 'shards'}")


def start_label(status: str) -> str:
    return {"running": "Pipeline running…", "done": "Run again (skips finished stages)",
            "stopped": "Resume pipeline", "failed": "Resume pipeline",
            "interrupted": "Resume pipeline"}.get(status, "Start pipeline")


class ProjectView:
    """The outputs every project-changing handler returns, in the order `ui.setup_tab.build` wires them:
    the project (its State), the banner, the title, the form's fields, then `extras` (the form's column,
    the no-project note, Calibrate, Save, the demo's "afresh" button), the materials table, the disk
    estimate with the Plan panel, Start and the HF token field."""

    EXTRAS = 5

    @staticmethod
    def extras(open_: bool, offer_afresh: bool = False) -> list:
        """The form (with the Plan panel) shown, or hidden behind the no-project note; Calibrate and Save
        usable only with a project; the "afresh" button only when this answer offers it."""
        return [gr.update(visible=open_), gr.update(visible=not open_), gr.update(interactive=open_),
                gr.update(interactive=open_), gr.update(visible=offer_afresh)]

    @staticmethod
    def banner_only(message: str, kind: str = "notice") -> tuple:
        """A banner, every other output left as it is: a step of an action that is not over yet."""
        return (gr.skip(), banner(message, kind), *[gr.skip() for _ in range(1 + len(FIELDS) + ProjectView.EXTRAS + 4)])

    @staticmethod
    def of(ctx: Ctx, project: Project | None, message: str = "", kind: str = "notice",
           error: ConfigError | None = None, offer_afresh: bool = False, wait: str | None = None) -> tuple:
        if project is None:
            return (None, banner(message, kind), "No project open", *[gr.update() for _ in FIELDS],
                    *ProjectView.extras(False), gr.update(value=[]), "",
                    gr.update(value="Start pipeline", interactive=False), gr.update(value="", interactive=False))
        values = form_values(project)
        infos = problem_updates(error)
        vis = visibility_updates(project)
        fields = [gr.update(value=v, info=i.get("info"), **({"visible": s["visible"]} if "visible" in s else {}))
                  for v, i, s in zip(values, infos, vis)]
        status = runtime_status(project)["status"]
        token = ("a token is saved (hidden); type a new one to replace it" if project.settings.hf_token
                 else "hf_… (only for gated or private repos; without one, your Hugging Face login's is used)")
        title = (f"**{project.settings.name}** · {project.pack.title} · `{project.root}` · status **{status}**")
        start = describe_start(project)
        title += f" · training starts from `{start}`" if start else ""
        table = materials_panel.rows(all_statuses(project, online=False))
        panel = disk_estimate(project) + "\n\n" + plan_markdown(project)
        return (str(project.root), banner(message, kind, wait=wait), title, *fields,
                *ProjectView.extras(True, offer_afresh),
                gr.update(value=table), panel, gr.update(value=start_label(status), interactive=status != "running"),
                gr.update(value="", placeholder=token, interactive=True))


def current_view(ctx: Ctx, current: str | None, message: str, kind: str = "error") -> tuple:
    """The view of the project open now, with a banner: what a refused action returns. Its path,
    title, materials and Start stay; the form keeps what the user typed (an unsaved edit survives).
    No project open (or one no longer inside the allowed folders): the "No project open" view."""
    project = None
    if current:
        try:
            project = Project.open(ctx.paths.check(current, "project folder"))
        except (PathRefused, TrainerError, OSError):   # gone, unreadable: "No project open"
            project = None
    if project is None:
        return ProjectView.of(ctx, None, message, kind)
    view = list(ProjectView.of(ctx, project, message, kind))
    view[3:3 + len(FIELDS)] = [gr.update() for _ in FIELDS]
    view[-1] = gr.update(interactive=True)       # the token field too: what was typed stays
    return tuple(view)


def _opened(ctx: Ctx, project: Project) -> None:
    """`project` was opened, created or demo'd in this app: it becomes the app's own project (what every
    page load shows), still the CLI's last project (`--auto-resume` relaunches it), and watched."""
    ctx.remember_project(project.root)
    remember_last_project(project.root)
    ctx.supervisor.attach(project.root)
