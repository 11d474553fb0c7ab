"""Hardware: the machine, the GPUs (nvidia-smi, and torch asked in a child process), disk free
at the project, and the versions the trainer runs on."""
from __future__ import annotations

import html
from typing import Any

import gradio as gr

from trainer_core.base.hardware import environment, machine_reading, torch_devices

from ui.context import Ctx

__all__ = ["build", "hardware_report"]


def hardware_report(ctx: Ctx, project_path: str | None, ask_torch: bool = True) -> str:
    m = machine_reading(project_path)
    env = environment()
    rows: list[tuple[str, str]] = [("OS", env["os"]), ("Host", env["host"]), ("CPU threads", str(m["cpu_threads"])),
                                   ("CPU load", f"{m['cpu_pct']}%"),
                                   ("RAM", f"{m['ram_used_gib']} / {m['ram_total_gib']} GiB used")]
    if m["gpus"] is None:
        rows.append(("GPUs", "none detected (nvidia-smi not found)"))
    for g in m["gpus"] or []:
        rows.append((f"GPU {g['index']}", f"{g['name']} · {g['vram_used_mib']}/{g['vram_total_mib']} MiB · "
                                          f"{g['util_pct']}% · {g['temp_c']}°C · {g['power_w']} W"))
    rows.append(("Disk free (project)", f"{m['disk_free_gib']} GiB" if m["disk_free_gib"] is not None else "–"))
    rows.append(("Python", env["python"]))
    for name in ("torch", "transformers", "accelerate", "gguf", "gradio", "huggingface_hub", "safetensors", "datasets"):
        rows.append((name, env[name]))
    if ask_torch:
        t = torch_devices()
        if "error" in t:
            rows.append(("torch devices", t["error"]))
        else:
            rows.append(("torch CUDA", f"build {t['cuda'] or 'none'} · available {t['cuda_available']}"))
            for d in t["devices"]:
                rows.append((f"cuda:{d['index']}", f"{d['name']} · {d['gib']} GiB"))
    body = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="gt-hardware">{body}</table>'


def build(ctx: Ctx, project_state: gr.State) -> dict[str, Any]:
    refresh = gr.Button("Refresh", elem_id="hw-refresh")
    table = gr.HTML("Press Refresh to read the machine.", elem_id="hw-table")
    refresh.click(lambda p: hardware_report(ctx, p), [project_state], [table], api_name="hardware")
    return {"table": table, "refresh": refresh}
