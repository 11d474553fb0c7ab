"""Progress in the terminal: a live bar per task (stage, download, demo step) with its rate and ETA
on a TTY, plain lines everywhere else (a log file, a pipe, CI).

Bars are tqdm's (the bars users of huggingface-cli, accelerate and tqdm-based trainers know); a
line written while bars are shown goes above them (`tqdm.write`), so log lines and bars never
interleave. Off a TTY, `update` prints one plain line each time a task passes another tenth of
its total, and `write` prints the line as it is.
"""
from __future__ import annotations

import sys
from typing import IO, Any, Callable

__all__ = ["TerminalBars", "progress_line"]


class TerminalBars:
    def __init__(self, stream: IO[str] | None = None, live: bool | None = None):
        self.stream = stream if stream is not None else sys.stdout
        if live is None:
            try:
                live = self.stream.isatty()
            except (AttributeError, ValueError):
                live = False
        self.live = bool(live)
        self._bars: dict[str, Any] = {}
        self._tenths: dict[str, int] = {}

    def update(self, key: str, count: float, total: float, unit: str = "", desc: str | None = None) -> None:
        """Task `key` is at `count` of `total` `unit`s ("B" shows bytes as KB/MB/GB)."""
        if not total:
            return
        if not self.live:
            tenth = int(10 * min(count, total) / total)
            if tenth > self._tenths.get(key, -1):
                self._tenths[key] = tenth
                shown = (f"{_size(count)} of {_size(total)}" if unit == "B"
                         else f"{count:g}/{total:g} {unit}".rstrip())
                self._plain(f"{desc or key}: {100 * tenth // 10}% ({shown})")
            return
        from tqdm import tqdm
        bar = self._bars.get(key)
        if bar is None:
            import shutil
            width = shutil.get_terminal_size((100, 24)).columns or 100     # a terminal that says 0 gets 100
            bar = self._bars[key] = tqdm(total=total, initial=count, unit=unit or "it", desc=desc or key,
                                         file=self.stream, ncols=width, leave=True, mininterval=0.2,
                                         unit_scale=unit == "B", unit_divisor=1024 if unit == "B" else 1000)
        if bar.total != total:
            bar.total = total
        if desc and bar.desc != desc:
            bar.set_description_str(desc, refresh=False)
        bar.update(count - bar.n)

    def close(self, key: str) -> None:
        """The task ended: its bar stays as it was last drawn."""
        bar = self._bars.pop(key, None)
        if bar is not None:
            bar.close()
        self._tenths.pop(key, None)

    def close_all(self) -> None:
        for key in list(self._bars):
            self.close(key)

    def write(self, line: str) -> None:
        """A log line, above the bars."""
        line = line.rstrip("\n")
        if self._bars:
            from tqdm import tqdm
            tqdm.write(line, file=self.stream)
        else:
            self._plain(line)

    def _plain(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def progress_line(material_id: str, bars: TerminalBars) -> Callable[[dict[str, Any]], None]:
    """A download's progress events as a bar on a terminal (bytes, rate, ETA), tenths otherwise."""
    def show(event: dict[str, Any]) -> None:
        if event.get("type") == "progress" and event.get("total"):
            bars.update(material_id, event["count"], event["total"], "B", desc=material_id)
    return show
