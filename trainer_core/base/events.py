"""The JSON-lines event stream: schema, writer, tailer, and the stages' `report` callable.

One event per line in `<project>/events.jsonl`:

    {"time": 1764441600.12, "run": "20261129-183012-4f2a", "stage": "corpus",
     "type": "progress", "payload": {"count": 1, "total": 3, "unit": "files", "detail": "..."}}

`type` is one of EVENT_TYPES; `payload` is an object whose keys depend on the type:

    status    {"status": running|done|stopped|failed|skipped|interrupted, "detail"?, "pid"?}
    progress  {"count", "total", "unit", "detail"?, "eta_s"?, "rate"?}
    metric    {"step"?, <metric name>: number, ...}
    log       {"level": info|warning|error, "message"}
    artifact  {"path", "kind", ...}
    error     {"message", "traceback"?}

A stage process prints events without `run`/`stage` on its stdout; the pipeline driver
stamps them and appends them here. The writer appends each line with a single write on
an O_APPEND descriptor, so concurrent writers never interleave and a reader sees either
a whole line or a line still missing its newline, which the tailer leaves for later.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, IO

__all__ = [
    "EVENT_TYPES", "make_event", "parse_event", "EventWriter", "EventTailer", "Reporter",
    "Report", "ListReport",
]

EVENT_TYPES = ("status", "progress", "metric", "log", "artifact", "error")

Report = Callable[..., None]   # report(type, **payload)


def make_event(type: str, payload: dict[str, Any] | None = None, *, stage: str | None = None,
               run: str | None = None, at: float | None = None) -> dict[str, Any]:
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type!r}; expected one of {EVENT_TYPES}")
    return {"time": time.time() if at is None else at, "run": run, "stage": stage,
            "type": type, "payload": dict(payload or {})}


def parse_event(line: str | bytes) -> dict[str, Any] | None:
    """The event on one line, or None when the line is not a well-formed event."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(obj, dict) and obj.get("type") in EVENT_TYPES):
        return None
    payload = obj.get("payload", {})
    if not isinstance(payload, dict):
        return None
    t = obj.get("time")
    return {"time": float(t) if isinstance(t, (int, float)) else time.time(),
            "run": obj.get("run"), "stage": obj.get("stage"), "type": obj["type"], "payload": payload}


def _encode(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, ensure_ascii=False, allow_nan=True, default=str) + "\n").encode("utf-8")


class EventWriter:
    """Appends events to a JSON-lines file, one unbuffered write per event."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: dict[str, Any]) -> None:
        data = _encode(event)
        while data:
            written = os.write(self._fd, data)
            data = data[written:]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EventTailer:
    """Reads the events appended since the last call, resuming from a byte offset.

    Only lines that end in a newline are returned; a partial last line stays unread until
    it is complete. A file that shrank (replaced or reset) is read again from the start.
    Lines that are not events are skipped.
    """

    def __init__(self, path: str | os.PathLike, offset: int = 0):
        self.path = Path(path)
        self.offset = offset

    def read(self, max_bytes: int = 8 << 20) -> list[dict[str, Any]]:
        """Events from whole lines appended since the last call (about `max_bytes` at most;
        a single longer line is still read whole)."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:
                    self.offset = 0
                f.seek(self.offset)
                chunk = f.read(max_bytes)
                while b"\n" not in chunk and len(chunk) and self.offset + len(chunk) < size:
                    chunk += f.read(max_bytes)  # one line longer than max_bytes
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        events = []
        for line in chunk[: end + 1].splitlines():
            event = parse_event(line)
            if event is not None:
                events.append(event)
        return events


class Reporter:
    """The `report(type, **payload)` a stage process uses: JSON lines on its stdout.

    If the driver is gone (a broken pipe), events are appended directly to the project's
    events file, stamped with the run id and stage the driver passed in the environment,
    so nothing the stage says after a driver crash is lost.
    """

    def __init__(self, stream: IO[str] | None = None, fallback: str | os.PathLike | None = None,
                 run: str | None = None, stage: str | None = None):
        self.stream = stream if stream is not None else sys.stdout
        self.fallback = Path(fallback) if fallback else None
        self.run, self.stage = run, stage
        self._writer: EventWriter | None = None

    def __call__(self, type: str, **payload: Any) -> None:
        event = make_event(type, payload)
        if self._writer is None:
            try:
                self.stream.write(_encode(event).decode("utf-8"))
                self.stream.flush()
                return
            except (BrokenPipeError, ValueError, OSError):
                if self.fallback is None:
                    return
                self._writer = EventWriter(self.fallback)
        event["run"], event["stage"] = self.run, self.stage
        self._writer.write(event)


class ListReport:
    """A `report` that collects events in memory: what tests pass to a stage."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, type: str, **payload: Any) -> None:
        self.events.append(make_event(type, payload))

    def of_type(self, type: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.events if e["type"] == type]
