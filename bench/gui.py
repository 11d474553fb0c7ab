"""GUI responsiveness: how long `python app.py` takes to answer its first page, and how long a
Train-tab tick takes with a 20 000-step metric history.

    PYTHONPATH=. python bench/gui.py [--starts N] [--ticks N] [--steps N] [--idle-s S] [--only-idle]

startup: `python app.py --no-browser --port P` in a fresh process, timed from the spawn to the
    first HTTP 200 on `/` (polled every 20 ms); the median of --starts runs (default 3).
tick: a project whose checkpoints/metrics.jsonl holds --steps points (default 20 000, one per
    step: the worst case, log_every 1) plus a validation point every 500 steps, opened in an
    app launched on loopback; the Train tab's tick is called the way the browser calls it (an
    HTTP POST to /gradio_api/run/predict in the page's session) --ticks times (default 200) in
    two cases:
      steady    nothing changed since the last tick (the chart is not re-sent);
      changing  a new metric point is appended before every tick and the Supervisor has read it,
                so every tick sends the downsampled chart.
    `tick_p95_ms` is the p95 of the changing case, the more expensive one. The same tick through
    gradio_client (which speaks the queue protocol, with its own round trips) is reported too.
idle: the CPU seconds (psutil: user + system, children included) `python app.py --no-browser`
    spends over --idle-s seconds (default 30) with no browser connected, twice: right after it
    answers its first page, and after a client opened a project and went away (the app keeps
    that project's live view). `idle_cpu_pct` is the second, the worse one, in % of one core.
The last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(home: Path) -> tuple[subprocess.Popen, str]:
    """`python app.py --no-browser` on a free port, its projects root under `home`: (process, url)."""
    port = free_port()
    env = {**os.environ, "GGUF_TRAINER_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--no-browser", "--port", str(port),
                             "--projects-root", str(home / "projects")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=home)
    return proc, f"http://127.0.0.1:{port}/"


def wait_answering(proc: subprocess.Popen, url: str) -> None:
    """Until the app's first page answers HTTP 200 (polled every 20 ms)."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc.poll() is not None:
            raise SystemExit(f"app.py exited with {proc.returncode} before answering")
        time.sleep(0.02)


def stop_app(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def time_startup(home: Path) -> float:
    started = time.perf_counter()
    proc, url = start_app(home)
    try:
        wait_answering(proc, url)
        return time.perf_counter() - started
    finally:
        stop_app(proc)


def cpu_seconds(pid: int, seconds: float) -> float:
    """CPU seconds (user + system, children included) the process spends over the next `seconds`."""
    import psutil
    process = psutil.Process(pid)

    def total() -> float:
        t = process.cpu_times()
        return t.user + t.system + t.children_user + t.children_system
    before = total()
    time.sleep(seconds)
    return total() - before


def time_idle(home: Path, seconds: float) -> dict[str, float]:
    """The idle app's CPU use with no browser: fresh, then after a client opened a project and left."""
    from gradio_client import Client
    os.environ["GGUF_TRAINER_HOME"] = str(home)
    sys.path.insert(0, str(REPO))
    from trainer_core.packs import DEMO_PACKS
    from trainer_core.project import Project
    project = Project.create(home / "projects" / "idle", DEMO_PACKS[0])
    write_history(project.root, 2000)
    proc, url = start_app(home)
    try:
        wait_answering(proc, url)
        time.sleep(2)                                       # past the start-up work
        fresh = cpu_seconds(proc.pid, seconds)
        client = Client(url, verbose=False)
        client.predict(str(project.root), api_name="/open_project")
        client.predict(api_name="/train_tick")
        client.close()
        time.sleep(5)                                       # the page's last ticks are over
        left = cpu_seconds(proc.pid, seconds)
    finally:
        stop_app(proc)
    return {"idle_fresh_cpu_s": round(fresh, 3), "idle_cpu_s": round(left, 3), "idle_s": seconds,
            "idle_cpu_pct": round(100 * left / seconds, 2)}


def write_history(project_root: Path, steps: int) -> None:
    ck = project_root / "checkpoints"
    ck.mkdir(parents=True, exist_ok=True)
    with open(ck / "metrics.jsonl", "w", encoding="utf-8") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "steps": steps, "loss": 2.0 / (1 + s / 500), "cos": 1 - 1 / (1 + s / 800),
                                "rel_mse": 0.5, "lr": 2e-4, "samples_per_s": 100.0, "eta_s": 10.0,
                                "time": 1.0}) + "\n")
    with open(ck / "val.jsonl", "w", encoding="utf-8") as f:
        for s in range(500, steps + 1, 500):
            f.write(json.dumps({"step": s, "val_cos": 1 - 1 / (1 + s / 900), "val_rel_mse": 0.4,
                                "best_val_cos": 1 - 1 / (1 + s / 900), "time": 1.0}) + "\n")


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def time_ticks(home: Path, steps: int, ticks: int) -> dict[str, float]:
    """Ticks as the browser sends them: POST /gradio_api/run/predict with the session's hash
    (the tick is an unqueued event), the session's State held by the server."""
    os.environ["GGUF_TRAINER_HOME"] = str(home)
    sys.path.insert(0, str(REPO))
    from gradio_client import Client

    from trainer_core.packs import DEMO_PACKS
    from trainer_core.project import Project
    from ui.app import make_context, serve
    ctx = make_context(home / "projects", demo_root=home / "demo")
    project = Project.create(ctx.projects_root / "history", DEMO_PACKS[0])
    write_history(project.root, steps)
    import contextlib
    with contextlib.redirect_stdout(sys.stderr):       # stdout carries only the JSON line
        app, url = serve(ctx, port=free_port(), open_browser=False, block=False)
    try:
        config = json.loads(urllib.request.urlopen(url + "config", timeout=30).read())
        fn = {d.get("api_name"): d["id"] for d in config["dependencies"]}
        session = "bench-gui-session"

        def call(name: str, data: list) -> tuple[float, dict]:
            body = json.dumps({"fn_index": fn[name], "data": data, "session_hash": session,
                               "event_data": None, "trigger_id": None}).encode()
            request = urllib.request.Request(url + "gradio_api/run/predict", data=body,
                                             headers={"Content-Type": "application/json"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(request, timeout=30) as r:
                reply = json.loads(r.read())
            return (time.perf_counter() - t0) * 1e3, reply

        call("open_project", [str(project.root), None])                 # the folder, the open project (State)
        view = ctx.supervisor.view(project.root)
        tick_states = [None, None, None, None]     # the project, the chart seen, the banner, the step axis: States
        call("train_tick", tick_states)                                 # the first tick sets the step axis,
        _, first = call("train_tick", tick_states)                      # the next one sends the chart
        chart = first["data"][2]
        chart_rows = len(chart["data"]) if isinstance(chart, dict) and "data" in chart else None
        steady = [call("train_tick", tick_states)[0] for _ in range(ticks)]
        metrics = project.checkpoints_dir / "metrics.jsonl"
        changing = []
        for i in range(ticks):
            with open(metrics, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": steps + i + 1, "loss": 0.5, "cos": 0.9}) + "\n")
            view.refresh()                                               # what the Supervisor thread does
            ms, reply = call("train_tick", tick_states)
            assert isinstance(reply["data"][2], dict), "the changed chart was not re-sent"
            changing.append(ms)
        # the same tick through gradio_client (its queue protocol), for comparison
        client = Client(url, verbose=False)
        client.predict(str(project.root), api_name="/open_project")
        via_client = []
        for _ in range(min(ticks, 50)):
            t0 = time.perf_counter()
            client.predict(api_name="/train_tick")
            via_client.append((time.perf_counter() - t0) * 1e3)
    finally:
        with contextlib.redirect_stdout(sys.stderr):
            app.close()
        ctx.supervisor.close()
    return {"tick_p95_ms": round(p95(changing), 2), "tick_median_ms": round(statistics.median(changing), 2),
            "steady_tick_p95_ms": round(p95(steady), 2), "steady_tick_median_ms": round(statistics.median(steady), 2),
            "gradio_client_tick_median_ms": round(statistics.median(via_client), 2),
            "history_points": steps, "chart_rows_sent": chart_rows, "ticks": ticks}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--only-idle", action="store_true", help="measure the idle app only")
    args = parser.parse_args()
    if args.only_idle:
        with tempfile.TemporaryDirectory(prefix="bench-gui-") as tmp:
            idle = time_idle(Path(tmp), args.idle_s)
        log(f"idle, no browser: {idle['idle_cpu_s']} CPU s over {args.idle_s:.0f} s ({idle['idle_cpu_pct']}% of a "
            f"core) with a project's live view kept; {idle['idle_fresh_cpu_s']} CPU s fresh")
        print(json.dumps(idle))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-gui-") as tmp:
        home = Path(tmp)
        starts = [time_startup(home) for _ in range(args.starts)]
        log(f"startup to first 200: {', '.join(f'{s:.2f}' for s in starts)} s")
        ticks = time_ticks(home, args.steps, args.ticks)
        log(f"train tick with {args.steps} points: p95 {ticks['tick_p95_ms']} ms (chart re-sent), "
            f"steady p95 {ticks['steady_tick_p95_ms']} ms")
    with tempfile.TemporaryDirectory(prefix="bench-gui-") as tmp:
        idle = time_idle(Path(tmp), args.idle_s)
        log(f"idle, no browser: {idle['idle_cpu_s']} CPU s over {args.idle_s:.0f} s ({idle['idle_cpu_pct']}%)")
    figures = {"startup_s": round(statistics.median(starts), 2), "startup_runs_s": [round(s, 2) for s in starts],
               **ticks, **idle}
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
