"""Hardware: the machine, the GPUs (nvidia-smi, and torch asked in a child process), disk free
at the project, and the versions the trainer runs on.

Filled without a click: on page load, when the project changes and each time the tab is opened
(a small HTML probe in the tab triggers it when it comes into view). The machine row is the Supervisor's
reading — the one the Train tab shows (`cpu_load()`, the same for every thread). torch is asked
once per app, in a child process, after the table is first shown."""
from __future__ import annotations

import html
import threading
import time
from typing import Any

import gradio as gr

from trainer_core.base.hardware import disk_free_gib, environment, torch_devices

from ui.context import Ctx

__all__ = ["build", "hardware_report", "torch_answer"]

_torch_lock = threading.Lock()
_torch: dict[str, Any] = {}          # torch's answer, once asked (its devices do not change)


def torch_answer(ask: bool = True, again: bool = False) -> dict[str, Any] | None:
    """torch's CUDA build and devices, asked once per app (seconds: a child process imports torch);
    None when not asked yet and `ask` is False. An error is asked again only when `again` (Refresh)."""
    with _torch_lock:
        if ask and (not _torch or (again and "error" in _torch)):
            _torch.clear()
            _torch.update(torch_devices())
        return dict(_torch) or None


def hardware_report(ctx: Ctx, project_path: str | None, ask_torch: bool = True, again: bool = False) -> str:
    m = ctx.supervisor.machine()
    env = environment()
    rows: list[tuple[str, str]] = [("OS", env["os"]), ("Host", env["host"]), ("CPU threads", str(m["cpu_threads"])),
                                   ("CPU load", f"{m['cpu_pct']}%"),
                                   ("RAM", f"{m['ram_used_gib']} / {m['ram_total_gib']} GiB used")]
    if m["gpus"] is None:
        rows.append(("GPUs", "none detected (nvidia-smi not found)"))
    for g in m["gpus"] or []:
        rows.append((f"GPU {g['index']}", f"{g['name']} · {g['vram_used_mib']}/{g['vram_total_mib']} MiB · "
                                          f"{g['util_pct']}% · {g['temp_c']}°C · {g['power_w']} W"))
    free = disk_free_gib(project_path) if project_path else None
    rows.append(("Disk free (project)", f"{free} GiB" if free is not None else "–"))
    rows.append(("Python", env["python"]))
    for name in ("torch", "transformers", "accelerate", "gguf", "gradio", "huggingface_hub", "safetensors", "datasets"):
        rows.append((name, env[name]))
    t = torch_answer(ask_torch, again)
    if t is None:
        rows.append(("torch devices", "asking torch…"))
    elif "error" in t:
        rows.append(("torch devices", t["error"]))
    else:
        rows.append(("torch CUDA", f"build {t['cuda'] or 'none'} · available {t['cuda_available']}"))
        for d in t["devices"]:
            rows.append((f"cuda:{d['index']}", f"{d['name']} · {d['gib']} GiB"))
    body = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="gt-hardware" data-cpu-pct="{m["cpu_pct"]}" data-shown-at="{time.time():.3f}">{body}</table>'


_ON_OPEN_JS = """
const opened = (seen) => { if (seen.some((e) => e.isIntersecting)) trigger('click'); };
if (window.IntersectionObserver) {    // the margin: only a hidden tab counts, not scrolling
  new IntersectionObserver(opened, {rootMargin: '100000px'}).observe(element);
} else {
  trigger('click');
}
"""


def build(ctx: Ctx, project_state: gr.State) -> dict[str, Any]:
    # Gradio 6 mounts a tab's children when it is first shown and keeps them, hidden, afterwards:
    # this probe (1 px high) triggers its own `click` whenever it is shown, i.e. each time the tab opens
    opened = gr.HTML('<div style="height:1px"></div>', elem_id="hw-opened", container=False, padding=False,
                     js_on_load=_ON_OPEN_JS)
    refresh = gr.Button("Refresh", elem_id="hw-refresh")
    table = gr.HTML("Reading the machine…", elem_id="hw-table")

    def fast(p: str | None) -> str:          # at once; torch's answer if it is already known
        return hardware_report(ctx, p, ask_torch=False)

    def full(p: str | None) -> str:
        return hardware_report(ctx, p, ask_torch=True)
    # on page load and when the project changes (gr.on without triggers), and on opening the tab
    gr.on(None, fast, [project_state], [table], api_name=False, show_progress="hidden", queue=False) \
        .then(full, [project_state], [table], api_name=False, show_progress="hidden")
    opened.click(fast, [project_state], [table], api_name=False, show_progress="hidden", queue=False) \
        .then(full, [project_state], [table], api_name=False, show_progress="hidden")
    refresh.click(lambda p: hardware_report(ctx, p, ask_torch=True, again=True), [project_state], [table],
                  api_name="hardware")
    return {"table": table, "refresh": refresh}
