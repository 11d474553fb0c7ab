"""`--auth` against a live server on loopback: before a login only the login page is served (no API
description, no projects root, every other route 401), and failed logins back off per client (429 with
Retry-After) on an injected clock, so nothing here sleeps."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest
from gradio_client import Client

from ui.app import serve
from ui.login_guard import LoginThrottle

from .conftest import free_port

USER, PASSWORD = "tester", "correct-horse"


def fetch(url: str, data: bytes | None = None, headers: dict[str, str] | None = None
          ) -> tuple[int, str, list[tuple[str, str]]]:
    """(status, body, every response header, repeated ones included)."""
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode("utf-8", "replace"), r.getheaders()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace"), list(e.headers.items())


def header(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [value for key, value in headers if key.lower() == name.lower()]


def login(url: str, password: str, client: str = "10.0.0.1") -> tuple[int, str, list[tuple[str, str]]]:
    """POST /login as the login page does; `client` is the address uvicorn reports (X-Forwarded-For from
    loopback is trusted, as from the share tunnel)."""
    form = urllib.parse.urlencode({"username": USER, "password": password}).encode()
    return fetch(url + "login", form, {"Content-Type": "application/x-www-form-urlencoded",
                                       "X-Forwarded-For": client})


@pytest.fixture
def clock():
    return [1000.0]


@pytest.fixture
def guarded(ctx, clock):
    app, url = serve(ctx, port=free_port(), auth=f"{USER}:{PASSWORD}", open_browser=False, block=False,
                     throttle=LoginThrottle(clock=lambda: clock[0]))
    yield url
    app.close()


def test_before_login_only_the_login_page_is_served(ctx, guarded):
    root = str(ctx.projects_root)
    status, page, _ = fetch(guarded)
    assert status == 200 and '"auth_required":true' in page.replace(" ", "")
    for secret in (root, "open_project", "create_project", "run_demo", "train_tick"):
        assert secret not in page, secret
    assert "window.gradio_api_info = null;" in page
    for path in ("config", "gradio_api/info", "info", "openapi.json", "gradio_api/openapi.json",
                 f"gradio_api/file={root}", "gradio_api/upload_progress", "logout", "gradio_api/queue/status"):
        status, body, _ = fetch(guarded + path)
        assert status == 401 and root not in body and "open_project" not in body, (path, status, body[:200])
    status, body, _ = fetch(guarded + "gradio_api/call/open_project", json.dumps({"data": ["/etc"]}).encode(),
                            {"Content-Type": "application/json"})
    assert status == 401 and "outside" not in body
    assert fetch(guarded + "theme.css")[0] == 200                       # what the login page itself needs

    status, _, headers = login(guarded, PASSWORD)
    assert status == 200
    cookies = "; ".join(value.split(";")[0] for value in header(headers, "Set-Cookie"))
    status, page, _ = fetch(guarded, headers={"Cookie": cookies})
    assert status == 200 and "open_project" in page and '"auth_required"' not in page   # the whole app now
    ok = Client(guarded, auth=(USER, PASSWORD), verbose=False)
    assert "outside the folders" in ok.predict("/etc", api_name="/open_project")[0]


def test_failed_logins_back_off_per_client_and_a_login_after_the_wait_works(guarded, clock):
    statuses, waits = [], set()
    for _ in range(30):
        status, body, headers = login(guarded, "wrong-password")
        statuses.append(status)
        if status == 429:
            waits.update(header(headers, "Retry-After"))
            assert "try again" in body
    assert statuses[:5] == [400] * 5 and statuses[5:] == [429] * 25
    assert waits == {"2"}
    assert login(guarded, "wrong-password", client="10.0.0.2")[0] == 400     # another client is not held back
    assert login(guarded, PASSWORD)[0] == 429                                  # not even the right password

    clock[0] += 2.5                                  # the wait is over: one more try, then twice as long
    assert login(guarded, "wrong-password")[0] == 400
    status, _, headers = login(guarded, PASSWORD)
    assert status == 429 and header(headers, "Retry-After") == ["4"]
    clock[0] += 4.5
    assert login(guarded, PASSWORD)[0] == 200
    assert login(guarded, "wrong-password")[0] == 400      # a success clears the count
    assert login(guarded, PASSWORD)[0] == 200


def test_the_throttle_doubles_its_wait_up_to_the_cap_and_forgets_a_quiet_client():
    now = [0.0]
    throttle = LoginThrottle(free=3, base_s=1.0, cap_s=5.0, forget_s=60.0, clock=lambda: now[0])
    assert [throttle.attempt("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert throttle.wait("a") == 1.0 and throttle.attempt("a") == 1.0 and throttle.wait("b") == 0.0
    waits = []
    for _ in range(4):
        now[0] += throttle.wait("a")
        assert throttle.attempt("a") == 0.0
        waits.append(throttle.wait("a"))
    assert waits == [2.0, 4.0, 5.0, 5.0]
    now[0] += 61.0                                       # a minute without an attempt: a fresh start
    assert throttle.wait("a") == 0.0
    assert [throttle.attempt("a") for _ in range(3)] == [0.0, 0.0, 0.0] and throttle.wait("a") == 1.0
    throttle.succeeded("a")
    assert throttle.wait("a") == 0.0
