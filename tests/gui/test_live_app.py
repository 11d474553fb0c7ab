"""The app launched on loopback and driven with gradio_client, the way a browser would:
create a project, run the demo, watch live metrics, apply steps, export a snapshot, see it
listed on the Output tab. Plus the launch policy and login against a live server."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from gradio_client import Client

from trainer_core.project import Project
from ui.app import LaunchRefused, launch_policy, serve

from .conftest import free_port


def wait_until(fn, timeout: float, what: str, every: float = 0.5):
    """Poll `fn` (an endpoint call) until it returns a truthy value; the server has no push channel."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture
def live(ctx):
    app, url = serve(ctx, port=free_port(), open_browser=False, block=False)
    yield url
    app.close()


def test_create_demo_metrics_steps_snapshot_output(ctx, live):
    client = Client(live, verbose=False)
    banner = client.predict("my_adapter", "t5xxl_pixart", str(ctx.projects_root), api_name="/create_project")[0]
    assert "Created" in banner and (ctx.projects_root / "my_adapter" / "project.json").is_file()

    banner = client.predict(api_name="/run_demo")[0]
    assert "Demo started" in banner, banner
    demo = Project.open(ctx.demo_root / "t5_adapter")

    def metrics_live():
        tick = client.predict(api_name="/train_tick")
        return tick if 'data-metric="loss"' in tick[3] and "–" not in tick[3].split('data-metric="loss">')[1][:3] else None
    tick = wait_until(metrics_live, 300, "the first training metrics of the demo")
    assert 'data-status="running"' in tick[1] or 'data-status="done"' in tick[1]

    banner = client.predict(240, api_name="/apply_steps")[0]
    assert "240" in banner
    assert Project.open(demo.root).settings.train.steps == 240

    def finished():
        tick = client.predict(api_name="/train_tick")
        return "status **done**" in tick[0]
    wait_until(finished, 400, "the demo pipeline to finish")
    last = json.loads((demo.checkpoints_dir / "last.json").read_text())
    assert last["step"] == 240                                  # the raised count was honoured

    banner = client.predict("last", False, api_name="/snapshot")
    assert "Snapshot export started" in banner, banner

    def listed():
        files = client.predict(api_name="/output_tick")[0]
        names = [row[0] for row in files["data"]] if isinstance(files, dict) else [row[0] for row in files]
        return names if any("-step240-" in n for n in names) else None
    names = wait_until(listed, 120, "the snapshot on the Output tab")
    assert f"{demo.settings.name}-f16.gguf" in names


def test_launch_policy_refuses_exposure_without_auth():
    with pytest.raises(LaunchRefused, match="--auth"):
        launch_policy("0.0.0.0", False, None)
    with pytest.raises(LaunchRefused, match="public share link"):
        launch_policy("127.0.0.1", True, None)
    with pytest.raises(LaunchRefused, match="at least 8"):
        launch_policy("0.0.0.0", False, "me:short")
    assert launch_policy("127.0.0.1", False, None) == (None, None)
    creds, shown = launch_policy("0.0.0.0", True, "generate")
    assert creds[0] == "trainer" and creds[1] == shown and len(shown) >= 16


def test_with_auth_an_unauthenticated_request_gets_no_data(ctx):
    app, url = serve(ctx, port=free_port(), auth="tester:correct-horse", open_browser=False, block=False)
    try:
        def status_of(path: str, data: bytes | None = None) -> tuple[int, str]:
            request = urllib.request.Request(url + path, data=data,
                                             headers={"Content-Type": "application/json"} if data else {})
            try:
                with urllib.request.urlopen(request, timeout=10) as r:
                    return r.status, r.read().decode("utf-8", "replace")
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode("utf-8", "replace")
        for path in ("config", "gradio_api/info"):
            status, body = status_of(path)
            assert status == 401 and "open_project" not in body and str(ctx.projects_root) not in body
        status, body = status_of("gradio_api/call/open_project", json.dumps({"data": ["/etc"]}).encode())
        assert status == 401 and "outside" not in body
        with pytest.raises(Exception):
            Client(url, verbose=False).predict("/etc", api_name="/open_project")
        ok = Client(url, auth=("tester", "correct-horse"), verbose=False)
        assert "outside the folders" in ok.predict("/etc", api_name="/open_project")[0]
    finally:
        app.close()


def test_the_token_is_absent_from_every_served_page(ctx, live):
    client = Client(live, verbose=False)
    client.predict("tok", "t5xxl_pixart", str(ctx.projects_root), api_name="/create_project")
    project = Project.open(ctx.projects_root / "tok")
    project.update_settings(["hf_token=hf_veryS3cretToken"])
    pages = [client.predict(str(project.root), api_name="/open_project"),
             client.predict(api_name="/train_tick"), client.predict(api_name="/output_tick")]
    for path in ("", "config", "gradio_api/info"):
        with urllib.request.urlopen(live + path, timeout=10) as r:
            pages.append(r.read().decode("utf-8", "replace"))
    assert "hf_veryS3cretToken" not in json.dumps(pages, default=str)
