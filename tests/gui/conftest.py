"""A GUI context over temp folders, and the app launched on loopback."""
from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TICK_S = 1.5                 # the app's own default


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    from ui.app import make_context
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio-tmp"))
    monkeypatch.chdir(tmp_path)
    # a page refreshes every TICK_S, the app's default: chromium works ~0.07 CPU-s per tick event, so at 0.3 s a
    # page kept one of CI's two cores busy (0.65–0.8 of a core, measured on an idle page) and the browser tests
    # took the other worker's core; at 1.5 s the page costs a fifth of that
    context = make_context(tmp_path / "projects", demo_root=tmp_path / "demo", tick_s=TICK_S)
    yield context
    context.supervisor.close()
