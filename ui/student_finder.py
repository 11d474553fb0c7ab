"""The materials panel's student section: what the pig_clip GGUF is, Find on the Hub (the search of
trainer_core/student_hub.py, its files listed with repo, size and quantization), Download selected (a detached
job, as every material downloads) and a file you already have (checked, then linked)."""
from __future__ import annotations

import json
from typing import Any, Callable

import gradio as gr

from trainer_core.base.diskspace import human
from trainer_core.base.errors import TrainerError
from trainer_core.materials import DEMO_OFFLINE, is_demo, token_for
from trainer_core.project import Project
from trainer_core.student_hub import STUDENT_ABOUT, find_students, link_student, quant_note, start_student_job

from ui.common import banner
from ui.paths import PathPolicy, PathRefused

__all__ = ["find", "download", "use_file", "build"]

NO_PROJECT = "Open or create a project first."


def _choice(c: Any) -> tuple[str, str]:
    label = f"{c.repo} · {c.path} · {human(c.size)} · {c.quant or '?'}: {quant_note(c.quant)}"
    return label, json.dumps([c.repo, c.path])


def find(project_path: str | None) -> tuple:
    """(banner, the found files' dropdown, Download selected): the Hub's pig_clip GGUFs, f16 first."""
    if not project_path:
        return banner(NO_PROJECT), gr.update(choices=[], value=None), gr.update(interactive=False)
    try:
        project = Project.open(project_path)
        if is_demo(project):             # its tiny student is its own; the demo never asks the Hub
            return banner(DEMO_OFFLINE, "notice"), gr.update(choices=[], value=None), gr.update(interactive=False)
        candidates = find_students(token_for(project))
    except TrainerError as e:
        return banner(str(e)), gr.update(choices=[], value=None), gr.update(interactive=False)
    if not candidates:
        return (banner("No pig_clip GGUF found on the Hub (model repos searched for pig_clip and pig-clip); if you "
                       "have the file, give its path below.", "notice"),
                gr.update(choices=[], value=None), gr.update(interactive=False))
    choices = [_choice(c) for c in candidates]
    note = f"Found {len(choices)} pig_clip GGUF{'s' if len(choices) > 1 else ''}; the f16 file is the one to train on."
    return banner(note, "ok"), gr.update(choices=choices, value=choices[0][1]), gr.update(interactive=True)


def download(project_path: str | None, choice: str | None, selected: str | None, refresh: Callable[..., tuple]
             ) -> tuple:
    """(banner, *the materials outputs): the chosen file's download started as a detached job (`selected`: the
    materials picker's value, kept)."""
    if not project_path:
        return (banner(NO_PROJECT), *refresh(None, None))
    again = refresh(project_path, selected, online=False)
    try:
        repo, path = json.loads(choice or "null") or (None, None)
    except ValueError:
        repo = path = None
    if not repo or not path:
        return (banner("Pick one of the files Find on the Hub listed first."), *again)
    try:
        pid = start_student_job(Project.open(project_path), repo, path)
    except TrainerError as e:
        return (banner(str(e)), *again)
    message = (f"Download of {path} from {repo} started (pid {pid}); it becomes the student once it is checked."
               if pid else "The student is already being downloaded.")
    return (banner(message, "ok" if pid else "notice"), *refresh(project_path, selected, online=False))


def use_file(paths: PathPolicy, project_path: str | None, text: str, selected: str | None,
             refresh: Callable[..., tuple]) -> tuple:
    """(banner, *the materials outputs): a pig_clip GGUF on disk, checked, as the project's student."""
    if not project_path:
        return (banner(NO_PROJECT), *refresh(None, None))
    try:
        target = link_student(Project.open(project_path), paths.check(text, "student file"))
    except (PathRefused, TrainerError) as e:
        return (banner(str(e)), *refresh(project_path, selected, online=False))
    return (banner(f"The student is now {target}.", "ok"), *refresh(project_path, selected, online=False))


def build(project_state: gr.State, top_banner: gr.HTML, paths: PathPolicy, outputs: list,
          refresh: Callable[..., tuple]) -> None:
    """The section's components and events (call inside the Materials accordion)."""
    with gr.Accordion("Student GGUF (pig_clip): what it is, where to get it", open=True, elem_id="student-section"):
        gr.Markdown(STUDENT_ABOUT, elem_id="student-about")
        with gr.Row():
            find_btn = gr.Button("Find on the Hub", elem_id="student-find", scale=1)
            found = gr.Dropdown([], label="pig_clip GGUFs on the Hub", elem_id="student-found", scale=4)
            get_btn = gr.Button("Download selected", interactive=False, elem_id="student-download", scale=1)
        with gr.Row():
            local = gr.Textbox(label="or a pig_clip GGUF you have (full path)", elem_id="student-path", scale=5,
                               placeholder="/path/to/pig_clip-f16.gguf", max_lines=1)
            use_btn = gr.Button("Use this file", elem_id="student-use", scale=1)
    find_btn.click(find, [project_state], [top_banner, found, get_btn], api_name="find_student", concurrency_limit=1)

    def download_chosen(project_path: str | None, choice: str | None, selected: str | None) -> tuple:
        return download(project_path, choice, selected, refresh)

    def use_typed(project_path: str | None, text: str, selected: str | None) -> tuple:
        return use_file(paths, project_path, text, selected, refresh)
    picker = outputs[1]          # the materials picker: its choice stays
    get_btn.click(download_chosen, [project_state, found, picker], [top_banner, *outputs], api_name="download_student",
                  concurrency_limit=1)
    use_btn.click(use_typed, [project_state, local, picker], [top_banner, *outputs], api_name="use_student_file")
