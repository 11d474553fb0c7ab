"""An app nobody looks at costs next to nothing: no browser connected, its server thread sleeps (Gradio's queue
polls at ui.app.QUEUE_POLL_S, not every millisecond). bench/gui.py measures the whole process."""
from __future__ import annotations

import time

import psutil

from ui.app import serve

from .conftest import free_port

WINDOW_S = 4.0
MAX_SHARE = 0.02          # of one core; Gradio's 1 ms poll took ~0.045


def _cpu_s(native_id: int) -> float:
    thread = next(t for t in psutil.Process().threads() if t.id == native_id)
    return thread.user_time + thread.system_time


def test_the_idle_server_thread_sleeps(ctx):
    app, _ = serve(ctx, port=free_port(), open_browser=False, block=False)
    try:
        server = app.server.thread.native_id        # uvicorn's event loop, where the queue's loops run
        time.sleep(1.0)                             # past the start-up
        before, started = _cpu_s(server), time.monotonic()
        time.sleep(WINDOW_S)
        used, elapsed = _cpu_s(server) - before, time.monotonic() - started
    finally:
        app.close()
    assert used / elapsed < MAX_SHARE, f"the idle server used {used:.3f} CPU s in {elapsed:.1f} s"
