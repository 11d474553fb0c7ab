"""The Gradio app: composes the five tabs and launches under the launch policy.

Launch policy: loopback (127.0.0.1) by default. `--share` (a public gradio.live link) or any
other `--host` needs `--auth user:pass` (or `--auth generate`: a random password printed once);
without it the app refuses to start. With a login, nothing but the login page is served before it
and failed logins back off per client (ui/login_guard.py). Always `ssr_mode=False` (the SSR auth
bypass of Gradio 6.27–6.31) and no run history. Closing the tab or the app never stops a run:
runs are detached processes the Supervisor only watches. Only a local app (loopback, no login)
lets its user change the projects root from the Setup tab (ui/projects_root.py).
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import sys
import webbrowser
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
from starlette.middleware import Middleware

from trainer_core import __version__
from trainer_core.cli import DEFAULT_PORT, DEMO_FOLDER
from trainer_core.project import default_projects_root, user_dir
from trainer_core.supervisor import Supervisor

from ui import hardware_tab, logs_tab, output_tab, setup_tab, train_tab
from ui.context import Ctx
from ui.login_guard import LoginGuard, LoginThrottle
from ui.paths import PathPolicy
from ui.projects_root import remembered_root

__all__ = ["build_app", "make_context", "launch_policy", "is_local", "LaunchRefused", "main", "serve", "ServeOptions",
           "quiet_queue"]

MATERIALS_ENV, ALLOWED_ENV = "GGUF_TRAINER_MATERIALS", "GGUF_TRAINER_ALLOWED_DIRS"
# Gradio's queue looks for queued work every 1 ms and for progress to send every 10 ms, whether a browser is
# connected or not (gradio 6.31, queueing.Queue.start_processing / start_progress_updates): ~5 % of a core for an
# app nobody looks at. It takes its own Windows intervals here: a queued click waits at most 50 ms longer; the
# timers' ticks are not queued (queue=False) and never wait.
QUEUE_POLL_S, PROGRESS_POLL_S = 0.05, 0.1


class LaunchRefused(ValueError):
    """A launch the policy does not allow; the message says what to add."""


@dataclass(frozen=True)
class ServeOptions:
    """How the GUI is served (`gguf-trainer serve --help` has the flags)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    open_browser: bool = True
    share: bool = False
    auth: str | None = None
    projects_root: str | None = None
    allow_dirs: tuple[str, ...] = ()
    demo_pack: str | None = None          # build (once) and start this pack's demo


def make_context(projects_root: str | os.PathLike | None = None, demo_root: str | os.PathLike | None = None,
                 allow: list[str] | None = None, tick_s: float = 1.5, local: bool = False) -> Ctx:
    projects = Path(projects_root).expanduser() if projects_root else default_projects_root()
    # the demo goes in the projects root (an allowed root; user_dir() is blocked from serving), never
    # in the current folder, which may be the clone
    demo = Path(demo_root).expanduser() if demo_root else projects / DEMO_FOLDER
    fixed: list[str | os.PathLike] = [os.environ[MATERIALS_ENV]] if os.environ.get(MATERIALS_ENV) else []
    fixed += [p for p in os.environ.get(ALLOWED_ENV, "").split(os.pathsep) if p]
    fixed += list(allow or [])
    paths = PathPolicy([projects, demo])
    fixed_roots = tuple(paths.allow(p) for p in fixed)
    return Ctx(supervisor=Supervisor().start(), paths=paths, projects_root=paths.check(projects, "projects root"),
               demo_root=paths.check(demo, "demo folder"), tick_s=tick_s, fixed_roots=fixed_roots,
               demo_in_root=demo_root is None, local=local)


# the tables' long cells (paths, notes) break anywhere rather than run the table out of its box
CSS = " ".join(f"#{t} td, #{t} td .cell-wrap {{ white-space: normal !important; overflow-wrap: anywhere; }}"
               for t in ("materials", "output-files", "snapshots"))


def build_app(ctx: Ctx) -> gr.Blocks:
    # the project every page load shows is this app's own (ui/context.py), settled now: a CLI command
    # run after this never changes what the app shows
    ctx.start_project()
    with gr.Blocks(title="gguf-trainer", analytics_enabled=False) as app:
        project_state = gr.State(None)
        gr.Markdown(f"## gguf-trainer {__version__} — pig_clip adapters for ggk")
        top_banner = gr.HTML("", elem_id="banner")
        # the timers live outside the tabs: a timer rendered inside a hidden tab leaves the
        # plots it updates blank (Gradio 6.31)
        fast, slow = gr.Timer(ctx.tick_s, active=True), gr.Timer(ctx.tick_s * 2, active=True)
        with gr.Tabs(selected=ctx.first_tab, elem_id="tabs"):
            with gr.Tab("Setup", id="setup"):
                setup = setup_tab.build(ctx, project_state, top_banner, slow)
            with gr.Tab("Train", id="train"):
                train = train_tab.build(ctx, project_state, top_banner, fast)
            with gr.Tab("Hardware", id="hardware"):
                hardware_tab.build(ctx, project_state)
            with gr.Tab("Logs", id="logs"):
                logs_tab.build(ctx, project_state, fast)
            with gr.Tab("Output", id="output"):
                output_tab.build(ctx, project_state, top_banner, slow)
        app.load(lambda: setup_tab.initial_project(ctx), [], setup["view_outputs"], api_name=False)
        project_state.change(train_tab.load_steps, [project_state], [train["steps_box"], train["steps_row"]],
                             api_name=False)
    return app


def quiet_queue(app: gr.Blocks) -> None:
    """Gradio's idle queue polls at QUEUE_POLL_S / PROGRESS_POLL_S instead of every 1 / 10 ms (a private
    attribute of its queue: a Gradio without it is left as it is)."""
    queue = getattr(app, "_queue", None)
    for name, period in (("sleep_when_free", QUEUE_POLL_S), ("progress_update_sleep_when_free", PROGRESS_POLL_S)):
        if isinstance(getattr(queue, name, None), (int, float)):
            setattr(queue, name, max(getattr(queue, name), period))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_local(host: str, share: bool, auth: str | None) -> bool:
    """Served on this computer only, without a login: its user is the machine's owner."""
    return auth is None and not share and _loopback(host)


def launch_policy(host: str, share: bool, auth: str | None) -> tuple[tuple[str, str] | None, str | None]:
    """(credentials, password to print once) for the launch, or LaunchRefused."""
    exposed = share or not _loopback(host)
    if auth is None:
        if exposed:
            where = "a public share link" if share else f"--host {host}"
            raise LaunchRefused(f"Refusing to start with {where} and no login: add --auth USER:PASSWORD "
                                f"(or --auth generate for a random password printed once).")
        return None, None
    if auth == "generate":
        password = secrets.token_urlsafe(12)
        return ("trainer", password), password
    user, sep, password = auth.partition(":")
    if not sep or not user or len(password) < 8:
        raise LaunchRefused("--auth must be USER:PASSWORD with a password of at least 8 characters "
                            "(or --auth generate).")
    return (user, password), None


def serve(ctx: Ctx, host: str = "127.0.0.1", port: int = DEFAULT_PORT, share: bool = False, auth: str | None = None,
          open_browser: bool = True, block: bool = True, throttle: LoginThrottle | None = None
          ) -> tuple[gr.Blocks, str]:
    credentials, shown = launch_policy(host, share, auth)
    ctx.local = credentials is None and is_local(host, share, auth)      # never for a shared app
    app = build_app(ctx)
    app.queue(default_concurrency_limit=4)
    quiet_queue(app)
    # with a login: only the login page before it, and a back-off after failed ones
    guard = [Middleware(LoginGuard, throttle=throttle or LoginThrottle(tunnel=share))] if credentials else []
    _, local_url, share_url = app.launch(
        server_name=host, server_port=port, share=share, auth=credentials, ssr_mode=False, run_history=False,
        prevent_thread_lock=True, quiet=True, show_error=True, inbrowser=False, css=CSS,
        blocked_paths=[str(user_dir())], max_file_size="1mb", enable_monitoring=False,
        app_kwargs={"middleware": guard})
    url = share_url or local_url
    public = f" (public link: {share_url})" if share_url else ""
    print(f"gguf-trainer {__version__} at {local_url}{public}", flush=True)
    if shown:
        print(f"login: user 'trainer', password {shown} (shown once; restart to change it)", flush=True)
    if open_browser:
        webbrowser.open(local_url)
    if block:
        try:
            app.block_thread()
        finally:
            ctx.supervisor.close()
    return app, url


def main(options: ServeOptions) -> int:
    """`gguf-trainer serve` / `python app.py` (ui/launcher.py parsed the arguments)."""
    try:
        launch_policy(options.host, options.share, options.auth)
    except LaunchRefused as e:
        print(f"gguf-trainer: {e}", file=sys.stderr)
        return 2
    local = is_local(options.host, options.share, options.auth)
    # the root chosen in a local app's GUI, unless --projects-root names one; a shared app keeps the default
    root = options.projects_root or (remembered_root() if local else None)
    ctx = make_context(root, allow=list(options.allow_dirs), local=local)
    if options.demo_pack:
        # the demo app lands on its demo: run_demo makes it the app's own project (Ctx.project)
        root = setup_tab.run_demo(ctx, options.demo_pack)[0]
        print(f"demo: {root or 'could not be started (see the GUI)'}", flush=True)
        ctx.first_tab = "train" if root else "setup"        # watch it run; a refusal's sentence is on Setup
    serve(ctx, options.host, options.port, options.share, options.auth, open_browser=options.open_browser)
    return 0
