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

`JsonLinesTailer` is the one reader of growing JSON-lines files (events, the metric series,
a job's log); `EventTailer` is that reader keeping only well-formed events.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, IO

__all__ = [
    "EVENT_TYPES", "make_event", "parse_event", "parse_record", "EventWriter", "JsonLinesTailer", "EventTailer",
    "Reporter", "Report", "ListReport",
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


def parse_record(line: str | bytes) -> dict[str, Any] | None:
    """The JSON object on one line, or None when the line is not one."""
    try:
        obj = json.loads(line)
    except ValueError:          # UnicodeDecodeError included
        return None
    return obj if isinstance(obj, dict) else None


def _encode(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, ensure_ascii=False, allow_nan=True, default=str) + "\n").encode("utf-8")


class EventWriter:
    """Appends events to a JSON-lines file, one unbuffered write per event."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: dict[str, Any]) -> None:
        """Append one line; a write that fails part-way (a full disk) is cut back off, so the file never
        ends in half a line."""
        data = _encode(event)
        start = os.fstat(self._fd).st_size
        try:
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
        except OSError:
            try:
                if os.fstat(self._fd).st_size > start:
                    os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class JsonLinesTailer:
    """Reads the JSON lines appended to a file since the last call, resuming from a byte offset.

    Only lines that end in a newline are returned; a partial last line stays unread until it
    is complete. A file that shrank, or was replaced by another one (an atomic rewrite: a resume
    truncating the metric series), is read again from the start, and so is one that vanished
    after it had been read; `poll` says when that happened, so a caller can drop what it had.
    Lines that `parse` rejects (returns None for) are skipped.
    """

    def __init__(self, path: str | os.PathLike, offset: int = 0,
                 parse: Callable[[bytes], dict[str, Any] | None] = parse_record):
        self.path = Path(path)
        self.offset = offset
        self.parse = parse
        self._identity: tuple[int, int] | None = None   # (device, inode) of the file last read

    def poll(self, max_bytes: int | None = 8 << 20) -> tuple[list[dict[str, Any]], bool]:
        """(records from whole lines appended since the last call, restarted). At most about
        `max_bytes` are read (a single longer line is still read whole); None reads all."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                identity = (st.st_dev, st.st_ino)
                restarted = False
                if st.st_size < self.offset or (self._identity is not None and identity != self._identity):
                    restarted = self.offset > 0 or self._identity is not None
                    self.offset = 0
                self._identity = identity
                if st.st_size == self.offset:
                    return [], restarted
                f.seek(self.offset)
                if max_bytes is None:
                    chunk = f.read()
                else:
                    chunk = f.read(max_bytes)
                    while b"\n" not in chunk and len(chunk) and self.offset + len(chunk) < st.st_size:
                        chunk += f.read(max_bytes)  # one line longer than max_bytes
        except (FileNotFoundError, NotADirectoryError):
            # gone after being read: a file that comes back is a new one. Never seen: keep the
            # offset the caller gave (a saved position in a file not created yet).
            restarted = self._identity is not None and self.offset > 0
            if self._identity is not None:
                self.offset, self._identity = 0, None
            return [], restarted
        end = chunk.rfind(b"\n")
        if end < 0:
            return [], restarted
        self.offset += end + 1
        records = []
        for line in chunk[: end + 1].splitlines():
            record = self.parse(line)
            if record is not None:
                records.append(record)
        return records, restarted

    def read(self, max_bytes: int | None = 8 << 20) -> list[dict[str, Any]]:
        """The records appended since the last call (see `poll`)."""
        return self.poll(max_bytes)[0]


class EventTailer(JsonLinesTailer):
    """The events appended to an events file since the last call; lines that are not events
    (a traceback, a launch banner) are skipped."""

    def __init__(self, path: str | os.PathLike, offset: int = 0):
        super().__init__(path, offset, parse=parse_event)


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
        try:
            self._writer.write(event)
        except OSError:     # no driver and a full or read-only disk: nowhere left to say it
            pass


class ListReport:
    """A `report` that collects events in memory: what tests pass to a stage."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, type: str, **payload: Any) -> None:
        self.events.append(make_event(type, payload))

    def of_type(self, type: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.events if e["type"] == type]
