"""The Output tab's "Publish to the Hub" panel (trainer_core/publish.py): the repo name (the adapter's name by
default: a NAME alone goes under the token's account), private by default, Review files lists exactly what goes
up with the sizes and only then enables Publish; Publish shows the progress lines as they come and the outcome.
Changing the repo or the choices after a review turns Publish off again, so what is sent is what was listed."""
from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import gradio as gr

from trainer_core.base.errors import TrainerError
from trainer_core.project import Project
from trainer_core.publish import check_repo_name, default_repo, is_machinery_check, planned_files, publish
from ui.common import banner, fmt_size
from ui.context import Ctx

__all__ = ["build", "publish_defaults", "review_publish", "run_publish"]


def publish_defaults(project_path: str | None) -> tuple[Any, Any]:
    """The repo name for the project just opened, and whether the machinery-check box shows."""
    try:
        project = Project.open(project_path) if project_path else None
    except TrainerError:
        project = None
    if project is None:
        return gr.update(value=""), gr.update(visible=False)
    return gr.update(value=default_repo(project)), gr.update(visible=is_machinery_check(project), value=False)


def review_publish(ctx: Ctx, project_path: str | None, repo: str, private: bool,
                   snapshots: bool) -> tuple[str, Any]:
    """(the confirm list or why not, Publish usable)."""
    if not project_path:
        return banner("Open a project first."), gr.update(interactive=False)
    try:
        project = Project.open(project_path)
        repo = check_repo_name(repo)
        files = planned_files(project, snapshots)
    except TrainerError as e:
        return banner(str(e)), gr.update(interactive=False)
    total = sum(f.size for f in files)
    lines = [f"These {len(files)} files ({fmt_size(total)}) go to the {'private' if private else 'public'} repo "
             f"{repo}, in one commit:", *(f"  {f.in_repo}   {fmt_size(f.size)}" for f in files)]
    if is_machinery_check(project):
        lines.append("This export is a machinery check (demo or mock teacher): it goes up only with the box above "
                     "ticked.")
    return banner("\n".join(lines), "notice"), gr.update(interactive=True)


def run_publish(ctx: Ctx, project_path: str | None, repo: str, private: bool, snapshots: bool,
                allow_demo: bool) -> Iterator[tuple[str, Any]]:
    """Publish in a worker thread; yield (the progress so far, then the outcome; Publish off again)."""
    if not project_path:
        yield banner("Open a project first."), gr.update(interactive=False)
        return
    said: queue.Queue = queue.Queue()
    done = object()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = publish(Project.open(project_path), repo, private, snapshots, allow_demo, said.put)
        except TrainerError as e:
            outcome["error"] = str(e)
        except Exception as e:  # noqa: BLE001 — a bug still ends as a visible line, not a silent panel
            outcome["error"] = f"Publishing failed: {type(e).__name__}: {e}"
        finally:
            said.put(done)

    threading.Thread(target=work, name="publish", daemon=True).start()
    progress: list[str] = []
    while (line := said.get()) is not done:
        progress.append(line)
        yield banner("\n".join(progress), "notice"), gr.update(interactive=False)
    if "error" in outcome:
        yield banner(outcome["error"]), gr.update(interactive=False)
        return
    result = outcome["result"]
    yield banner(f"Published {len(result['files'])} files to {result['repo']} (commit {result['commit'][:12]}: "
                 f"{result['message']}).", "ok"), gr.update(interactive=False)


def build(ctx: Ctx, project_state: gr.State) -> None:
    gr.Markdown("### Publish to the Hub")
    with gr.Row():
        repo = gr.Textbox(label="Hub repo", info="OWNER/NAME; a NAME alone goes under your account", max_lines=1,
                          elem_id="publish-repo")
        private = gr.Checkbox(label="Private", value=True, elem_id="publish-private")
        snapshots = gr.Checkbox(label="Include snapshots", value=False, elem_id="publish-snapshots")
        allow_demo = gr.Checkbox(label="Publish a machinery check (demo or mock teacher)", value=False,
                                 visible=False, elem_id="publish-allow-demo")
    with gr.Row():
        review = gr.Button("Review files", elem_id="publish-review")
        send = gr.Button("Publish", variant="primary", interactive=False, elem_id="publish-btn")
    status = gr.HTML("", elem_id="publish-status")
    project_state.change(publish_defaults, [project_state], [repo, allow_demo], api_name=False)
    review.click(lambda p, r, pr, s: review_publish(ctx, p, r, pr, s), [project_state, repo, private, snapshots],
                 [status, send], api_name=False)
    for box in (repo, private, snapshots):            # what Publish sends is what the review listed
        box.change(lambda: gr.update(interactive=False), None, [send], queue=False, api_name=False)

    def publish_clicked(path: str | None, name: str, hidden: bool, snaps: bool, demo_ok: bool) -> Iterator:
        yield from run_publish(ctx, path, name, hidden, snaps, demo_ok)
    send.click(publish_clicked, [project_state, repo, private, snapshots, allow_demo], [status, send],
               api_name=False)
