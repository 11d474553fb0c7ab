"""The Hardware tab's table: the machine reading the Train tab shows (not psutil's per-thread 0.0),
and torch asked once per app."""
from __future__ import annotations

import re
import subprocess
import sys
import threading

from ui import hardware_tab


def test_the_table_shows_the_supervisors_reading_busy_from_a_handler_thread(ctx):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        shown: list[str] = []
        worker = threading.Thread(target=lambda: shown.append(hardware_tab.hardware_report(ctx, None, ask_torch=False)))
        worker.start()              # a fresh thread, as a Gradio handler gets: its first reading was 0.0
        worker.join()
        cpu = float(re.search(r'data-cpu-pct="([\d.]+)"', shown[0])[1])
        assert cpu > 0.0 and f"<b>CPU load</b></td><td>{cpu}%" in shown[0]
        assert cpu == ctx.supervisor.machine()["cpu_pct"]          # the reading the Train tab shows
    finally:
        busy.kill()
        busy.wait()


def test_torch_is_asked_once_and_an_error_again_only_on_refresh(ctx, monkeypatch):
    answers = [{"error": "torch could not be asked for its devices (TimeoutExpired)"},
               {"torch": "2.0", "cuda": None, "cuda_available": False, "devices": []}]
    asked: list[int] = []

    def fake_devices() -> dict:
        asked.append(1)
        return answers[len(asked) - 1]
    monkeypatch.setattr(hardware_tab, "_torch", {})
    monkeypatch.setattr(hardware_tab, "torch_devices", fake_devices)
    assert "asking torch" in hardware_tab.hardware_report(ctx, None, ask_torch=False) and not asked
    assert "TimeoutExpired" in hardware_tab.hardware_report(ctx, None) and len(asked) == 1
    assert "TimeoutExpired" in hardware_tab.hardware_report(ctx, None) and len(asked) == 1    # opening again
    assert "build none" in hardware_tab.hardware_report(ctx, None, again=True) and len(asked) == 2   # Refresh
    assert "build none" in hardware_tab.hardware_report(ctx, None, again=True) and len(asked) == 2
