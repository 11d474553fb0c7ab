"""The event stream: schema, writer, tailer, Reporter and ListReport."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_core.base.events import (
    EVENT_TYPES, EventTailer, EventWriter, ListReport, Reporter, make_event, parse_event,
)

REPO = Path(__file__).resolve().parent.parent


def _line(type_: str, **payload) -> bytes:
    """One event line written by hand, independent of the writer."""
    return (json.dumps({"time": 1.5, "run": "r", "stage": "s", "type": type_,
                        "payload": payload}) + "\n").encode("utf-8")


# ---------------------------------------------------------------- make_event / parse_event

def test_event_types_are_the_documented_six():
    assert set(EVENT_TYPES) == {"status", "progress", "metric", "log", "artifact", "error"}


@pytest.mark.parametrize("bad", ["warning", "", "STATUS", "metrics"])
def test_make_event_rejects_unknown_types(bad):
    with pytest.raises(ValueError, match="unknown event type"):
        make_event(bad, {"x": 1})


def test_make_event_fields():
    payload = {"count": 1}
    e = make_event("progress", payload, stage="corpus", run="run-1", at=12.5)
    assert e == {"time": 12.5, "run": "run-1", "stage": "corpus", "type": "progress",
                 "payload": {"count": 1}}
    payload["count"] = 99  # the event holds a copy
    assert e["payload"] == {"count": 1}
    assert make_event("log")["payload"] == {}


@pytest.mark.parametrize("line", [
    "not json at all",
    "{\"type\": \"log\"",          # truncated JSON
    "",
    "[1, 2, 3]",                   # JSON, not an object
    "\"log\"",
    "42",
    "null",
    json.dumps({"type": "bogus", "payload": {}}),        # unknown type
    json.dumps({"payload": {"a": 1}}),                    # no type
    json.dumps({"type": "log", "payload": [1, 2]}),       # payload not an object
    json.dumps({"type": "log", "payload": "text"}),
    json.dumps({"type": "log", "payload": None}),
    b"\xff\xfe{not utf-8}",
])
def test_parse_event_rejects(line):
    assert parse_event(line) is None


def test_parse_event_accepts_str_and_bytes():
    obj = {"time": 3.25, "run": "abc", "stage": "train", "type": "metric",
           "payload": {"step": 10, "loss": 0.5, "note": "café"}}
    text = json.dumps(obj, ensure_ascii=False)
    for line in (text, text + "\n", text.encode("utf-8"), (text + "\n").encode("utf-8")):
        assert parse_event(line) == obj


def test_parse_event_fills_missing_fields():
    e = parse_event(json.dumps({"type": "status"}))
    assert e is not None
    assert e["type"] == "status" and e["payload"] == {}
    assert e["run"] is None and e["stage"] is None
    assert isinstance(e["time"], float)


# ---------------------------------------------------------------- EventWriter

def test_writer_appends_one_line_per_event(tmp_path):
    path = tmp_path / "sub" / "events.jsonl"   # the folder is created
    events = [make_event("log", {"level": "info", "message": f"m{i} ünï"}, run="r", stage="s", at=i)
              for i in range(5)]
    with EventWriter(path) as w:
        for e in events[:3]:
            w.write(e)
    with EventWriter(path) as w:   # a second writer appends, never truncates
        for e in events[3:]:
            w.write(e)
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    assert len(lines) == 5
    assert [parse_event(line) for line in lines] == events


# ---------------------------------------------------------------- EventTailer

def test_tailer_missing_file(tmp_path):
    t = EventTailer(tmp_path / "nope.jsonl")
    assert t.read() == []
    assert t.offset == 0


def test_tailer_reads_only_new_events(tmp_path):
    path = tmp_path / "events.jsonl"
    t = EventTailer(path)
    with EventWriter(path) as w:
        w.write(make_event("status", {"status": "running"}))
        w.write(make_event("progress", {"count": 1, "total": 2}))
        got = t.read()
        assert [e["type"] for e in got] == ["status", "progress"]
        assert t.offset == path.stat().st_size
        assert t.read() == []
        w.write(make_event("status", {"status": "done"}))
        got = t.read()
    assert [e["payload"] for e in got] == [{"status": "done"}]


def test_tailer_leaves_partial_line_for_later(tmp_path):
    path = tmp_path / "events.jsonl"
    first = _line("status", status="running")
    second = _line("log", level="info", message="second")
    path.write_bytes(first + second[:10])   # a line still missing its end and newline
    t = EventTailer(path)
    got = t.read()
    assert [e["payload"] for e in got] == [{"status": "running"}]
    assert t.offset == len(first)
    # nothing more while the line is incomplete, and the offset stays put
    assert t.read() == []
    assert t.offset == len(first)
    with open(path, "ab") as f:
        f.write(second[10:-1])            # everything but the newline
    assert t.read() == []
    assert t.offset == len(first)
    with open(path, "ab") as f:
        f.write(b"\n")
    got = t.read()
    assert [e["payload"] for e in got] == [{"level": "info", "message": "second"}]
    assert t.offset == len(first) + len(second)


def test_tailer_only_partial_line(tmp_path):
    path = tmp_path / "events.jsonl"
    line = _line("status", status="done")
    path.write_bytes(line[:-1])
    t = EventTailer(path)
    assert t.read() == []
    assert t.offset == 0
    path.write_bytes(line)
    assert [e["type"] for e in t.read()] == ["status"]


def test_tailer_resumes_from_saved_offset(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as w:
        for i in range(3):
            w.write(make_event("metric", {"step": i}))
    t1 = EventTailer(path)
    assert [e["payload"]["step"] for e in t1.read()] == [0, 1, 2]
    saved = t1.offset
    assert saved == path.stat().st_size
    with EventWriter(path) as w:
        for i in range(3, 5):
            w.write(make_event("metric", {"step": i}))
    t2 = EventTailer(path, offset=saved)
    assert [e["payload"]["step"] for e in t2.read()] == [3, 4]
    # the first tailer sees the same two
    assert [e["payload"]["step"] for e in t1.read()] == [3, 4]


def test_tailer_rereads_truncated_file(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(_line("metric", step=i) for i in range(4)))
    t = EventTailer(path)
    assert len(t.read()) == 4
    with open(path, "r+b") as f:
        f.truncate(0)
    assert t.read() == []
    assert t.offset == 0
    path.write_bytes(_line("status", status="running"))   # shorter than before
    got = t.read()
    assert [e["payload"] for e in got] == [{"status": "running"}]


def test_tailer_rereads_replaced_shorter_file(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(_line("metric", step=i) for i in range(4)))
    t = EventTailer(path)
    assert len(t.read()) == 4
    new = tmp_path / "new.jsonl"
    new.write_bytes(_line("status", status="a") + _line("status", status="b"))
    os.replace(new, path)
    got = t.read()
    assert [e["payload"]["status"] for e in got] == ["a", "b"]
    assert t.offset == path.stat().st_size


def test_tailer_skips_non_event_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        _line("status", status="running")
        + b"Traceback (most recent call last):\n"
        + b"\n"
        + b"[1, 2]\n"
        + b'{"type": "nonsense", "payload": {}}\n'
        + b'{"type": "log", "payload": 5}\n'
        + b"\xff\xfe\n"
        + _line("status", status="done")
    )
    t = EventTailer(path)
    got = t.read()
    assert [e["payload"]["status"] for e in got] == ["running", "done"]
    assert t.offset == path.stat().st_size


# ---------------------------------------------------------------- concurrent writers

_CHILD = r"""
import sys
from trainer_core.base.events import EventWriter, make_event
path, writer = sys.argv[1], int(sys.argv[2])
w = EventWriter(path)
sys.stdin.readline()          # wait for the parent's go, so the four write together
pad = "x" * (200 + 97 * writer)
for seq in range(500):
    w.write(make_event("metric", {"writer": writer, "seq": seq, "pad": pad}))
w.close()
"""


def test_concurrent_writers_never_interleave(tmp_path):
    path = tmp_path / "events.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(i)],
                              stdin=subprocess.PIPE, env=env) for i in range(4)]
    try:
        for p in procs:      # each child opens the file, then blocks on stdin until this go
            p.stdin.write(b"go\n")
            p.stdin.flush()
        for p in procs:
            p.stdin.close()
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    assert len(lines) == 2000
    seqs: dict[int, list[int]] = {i: [] for i in range(4)}
    for line in lines:
        e = parse_event(line)
        assert e is not None, line[:120]
        p = e["payload"]
        assert p["pad"] == "x" * (200 + 97 * p["writer"])
        seqs[p["writer"]].append(p["seq"])
    for i in range(4):
        assert seqs[i] == list(range(500))
    # the tailer agrees
    assert len(EventTailer(path).read()) == 2000


# ---------------------------------------------------------------- Reporter / ListReport

def test_reporter_writes_one_json_line_per_call():
    stream = io.StringIO()
    report = Reporter(stream=stream)
    report("progress", count=1, total=3, unit="files", detail="reading a.txt")
    report("log", level="info", message="héllo")
    report("status", status="done")
    text = stream.getvalue()
    assert text.endswith("\n")
    lines = text.split("\n")[:-1]
    assert len(lines) == 3
    events = [parse_event(line) for line in lines]
    assert [e["type"] for e in events] == ["progress", "log", "status"]
    assert events[0]["payload"] == {"count": 1, "total": 3, "unit": "files", "detail": "reading a.txt"}
    assert events[1]["payload"] == {"level": "info", "message": "héllo"}
    assert events[2]["payload"] == {"status": "done"}


def test_reporter_rejects_unknown_type():
    report = Reporter(stream=io.StringIO())
    with pytest.raises(ValueError):
        report("chatter", message="x")


class _BrokenStream:
    def __init__(self):
        self.calls = 0

    def write(self, text):
        self.calls += 1
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_reporter_falls_back_to_events_file_on_broken_pipe(tmp_path):
    fallback = tmp_path / "proj" / "events.jsonl"
    stream = _BrokenStream()
    report = Reporter(stream=stream, fallback=fallback, run="20260101-000000-abcd", stage="corpus")
    report("log", level="warning", message="driver gone")
    report("status", status="done")
    events = EventTailer(fallback).read()
    assert [e["type"] for e in events] == ["log", "status"]
    assert events[0]["payload"] == {"level": "warning", "message": "driver gone"}
    assert events[1]["payload"] == {"status": "done"}
    for e in events:
        assert e["run"] == "20260101-000000-abcd"
        assert e["stage"] == "corpus"
    assert len(fallback.read_bytes().split(b"\n")) == 3   # two lines and the final newline


def test_reporter_broken_pipe_without_fallback_is_silent():
    report = Reporter(stream=_BrokenStream())
    report("status", status="done")   # must not raise


def test_list_report_collects_and_filters():
    rep = ListReport()
    rep("log", level="info", message="a")
    rep("progress", count=0, total=2)
    rep("log", level="warning", message="b")
    rep("artifact", path="/x", kind="corpus_val", lines=3)
    assert [e["type"] for e in rep.events] == ["log", "progress", "log", "artifact"]
    assert rep.of_type("log") == [{"level": "info", "message": "a"},
                                  {"level": "warning", "message": "b"}]
    assert rep.of_type("artifact") == [{"path": "/x", "kind": "corpus_val", "lines": 3}]
    assert rep.of_type("error") == []
    with pytest.raises(ValueError):
        rep("nonsense")


def test_tailer_reads_a_line_longer_than_its_chunk(tmp_path):
    from trainer_core.base.events import EventTailer, EventWriter, make_event
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as w:
        w.write(make_event("log", {"level": "info", "message": "x" * 5000}))
        w.write(make_event("log", {"level": "info", "message": "short"}))
    tailer = EventTailer(path)
    got = tailer.read(max_bytes=1000)
    got += tailer.read(max_bytes=1000)
    assert [e["payload"]["message"] for e in got] == ["x" * 5000, "short"]
    assert tailer.read(max_bytes=1000) == []
    assert tailer.offset == path.stat().st_size
