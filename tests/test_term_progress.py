"""Issue 19 item 8: progress in the terminal — live bars with rate and ETA on a TTY, plain lines
when the output is a file or a pipe."""
from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

from conftest import cli
from trainer_core.term_progress import TerminalBars


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_off_a_terminal_one_per_tenth():
    out = io.StringIO()
    bars = TerminalBars(out)
    assert not bars.live
    for count in range(0, 101):
        bars.update("train", count, 100, "steps")
    bars.write("[train] a log line")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[:-1] == [f"train: {10 * k}% ({10 * k}/100 steps)" for k in range(11)]
    assert lines[-1] == "[train] a log line"


def test_bytes_show_as_sizes_off_a_terminal():
    out = io.StringIO()
    bars = TerminalBars(out)
    bars.update("teacher", 3 << 20, 10 << 20, "B")
    assert out.getvalue() == "teacher: 30% (3.0 MB of 10.0 MB)\n"


def test_a_terminal_gets_one_redrawn_bar_with_rate_and_eta_and_lines_above_it():
    out = FakeTTY()
    bars = TerminalBars(out)
    assert bars.live
    bars.update("train", 200, 1000, "steps", desc="train")        # resumed at 200: the rate counts from there
    for count in range(210, 400, 10):
        bars.update("train", count, 1000, "steps", desc="train")
    bars.write("[train] val @ 400")
    bars.close("train")
    text = out.getvalue()
    frames = [f for f in text.split("\r") if f.strip()]
    assert len(frames) >= 2                                         # redrawn in place, not a line per update
    assert re.search(r"train:\s+\d+%\|.*\| \d+/1000 \[\d\d:\d\d<\d\d:\d\d", text)      # elapsed < ETA
    assert re.search(r"steps/s|s/steps", text)
    assert "[train] val @ 400\n" in text


def _read_pty(argv: list[str], timeout: float = 300) -> str:
    """Run argv with its stdout and stderr on a pseudo-terminal; everything it wrote."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))     # a 120-column terminal
    proc = subprocess.Popen(argv, stdout=child, stderr=child, stdin=subprocess.DEVNULL, close_fds=True,
                            env=os.environ)
    os.close(child)
    chunks = []
    while True:
        ready, _, _ = select.select([main], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError("no output for too long")
        try:
            data = os.read(main, 65536)
        except OSError:                      # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=timeout)
    os.close(main)
    return b"".join(chunks).decode("utf-8", "replace")


def test_run_draws_bars_on_a_terminal_and_plain_lines_in_a_pipe(tmp_path):
    root = tmp_path / "t5_adapter"
    shown = _read_pty([sys.executable, "-m", "trainer_core", "demo", "--project", str(root)])
    assert "demo: ready" in shown and "\r" in shown and "5/5" in shown
    assert cli("set", "--project", str(root), "--set", "train.steps=40", "--set", "train.log_every=5").returncode == 0

    piped = cli("run", "--project", str(root), "--only", "corpus", "precompute_val")      # a pipe: plain lines
    assert piped.returncode == 0 and "\r" not in piped.stdout
    assert "precompute_val: 100% (1/1 shards)" in piped.stdout

    shown = _read_pty([sys.executable, "-m", "trainer_core", "run", "--project", str(root), "--only",
                       "precompute_train", "train"])
    assert re.search(r"precompute_train:\s+\d+%\|.*\| 3/3 \[", shown), shown[-2000:]
    assert re.search(r"train:\s+100%\|.*\| 40/40 \[", shown), shown[-2000:]
    assert "[train] done" in shown and "precompute_train: 100% (" not in shown    # bars, not the plain lines
    assert (root / "pipeline.log").read_text().count("\r") == 0
