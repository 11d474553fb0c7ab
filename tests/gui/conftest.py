"""A GUI context over temp folders, and the app launched on loopback."""
from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    from ui.app import make_context
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio-tmp"))
    monkeypatch.chdir(tmp_path)
    context = make_context(tmp_path / "projects", demo_root=tmp_path / "demo", tick_s=0.3)
    yield context
    context.supervisor.close()
