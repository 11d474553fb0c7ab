"""`--auth` against a live server on loopback: before a login only the login page is served (no API
description, no projects root, every other route 401), and failed logins back off per client and per
account (429 with Retry-After) on an injected clock, so nothing here sleeps. A spoofed X-Forwarded-For
buys no fresh tries: without a tunnel it is ignored, behind one only its last entry (the tunnel's) counts,
and the account's budget holds whatever the tunnel forwards."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest
from gradio_client import Client

from ui.app import serve
from ui.login_guard import LoginThrottle, client_key

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


def login(url: str, password: str, client: str | None = "10.0.0.1") -> tuple[int, str, list[tuple[str, str]]]:
    """POST /login as the login page does, with `client` as its X-Forwarded-For (none when None): from
    loopback, as the share tunnel's requests come, it names the client when the app has a tunnel."""
    form = urllib.parse.urlencode({"username": USER, "password": password}).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    return fetch(url + "login", form, headers if client is None else {**headers, "X-Forwarded-For": client})


def refusal(status: int, body: str, headers: list[tuple[str, str]]) -> tuple[str, int]:
    """A 429's one sentence and its Retry-After, checked for shape (JSON, no traceback, the same wait)."""
    assert status == 429, (status, body[:200])
    assert "Traceback" not in body and "File \"" not in body
    detail = json.loads(body)["detail"]
    found = re.fullmatch(r"Too many failed logins (?:from this address|for this account); try again in (\d+) s\.",
                         detail)
    assert found, detail
    assert header(headers, "Retry-After") == [found.group(1)]
    return detail, int(found.group(1))


@pytest.fixture
def clock():
    return [1000.0]


@pytest.fixture
def launch(ctx, clock):
    """serve() with a login and a throttle on `clock`; `tunnel`: as if shared (the tunnel on loopback)."""
    apps = []

    def start(tunnel: bool) -> str:
        app, url = serve(ctx, port=free_port(), auth=f"{USER}:{PASSWORD}", open_browser=False, block=False,
                         throttle=LoginThrottle(clock=lambda: clock[0], tunnel=tunnel))
        apps.append(app)
        return url
    yield start
    for app in apps:
        app.close()


@pytest.fixture
def guarded(launch):
    """The app as behind the share tunnel: X-Forwarded-For's last entry names the client."""
    return launch(tunnel=True)


@pytest.fixture
def unshared(launch):
    """The app without a tunnel (serve's default): X-Forwarded-For is nobody's address."""
    return launch(tunnel=False)


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


def spoofed(i: int) -> str:
    """An X-Forwarded-For of the probe's kind: a different made-up chain each time."""
    return f"198.51.100.{i % 250}, 10.{i // 250}.{i % 250}.{(7 * i) % 250}"


def test_without_a_tunnel_a_spoofed_forwarded_for_buys_no_tries_and_the_user_gets_in_after_the_wait(
        unshared, clock):
    statuses, details = [], set()
    for i in range(100):                          # the probe: 100 tries from loopback, each with another header
        status, body, headers = login(unshared, "wrong-password", client=spoofed(i))
        statuses.append(status)
        if status == 429:
            details.add(refusal(status, body, headers)[0])
    assert statuses[:5] == [400] * 5 and statuses[5:] == [429] * 95      # keyed by the connection, not the header
    assert details == {"Too many failed logins from this address; try again in 2 s."}
    status, body, headers = login(unshared, PASSWORD, client=None)       # the user on loopback, no header
    _, wait = refusal(status, body, headers)
    assert login(unshared, PASSWORD, client="203.0.113.9")[0] == 429     # nor does a header let the user in

    clock[0] += wait + 0.5                                                # the lockout window is over
    status, _, headers = login(unshared, PASSWORD, client=None)
    assert status == 200 and header(headers, "Set-Cookie")
    assert login(unshared, "wrong-password", client=spoofed(0))[0] == 400    # the success cleared the count


def test_behind_the_tunnel_only_its_last_entry_counts_and_the_account_budget_holds_whatever_it_forwards(
        guarded, clock):
    for i in range(5):                  # earlier entries are the client's own words: one client, however they vary
        assert login(guarded, "wrong-password", client=f"10.9.{i}.1, 203.0.113.50")[0] == 400
    status, body, headers = login(guarded, "wrong-password", client="10.9.99.1, 203.0.113.50")
    assert refusal(status, body, headers)[0] == "Too many failed logins from this address; try again in 2 s."

    statuses, details = [], set()
    for i in range(100):                # 100 different last entries: as if from 100 addresses (or a fake tunnel)
        status, body, headers = login(guarded, "wrong-password", client=f"{spoofed(i)}, 192.0.2.{i}")
        statuses.append(status)
        if status == 429:
            details.add(refusal(status, body, headers)[0])
    assert statuses[:15] == [400] * 15 and statuses[15:] == [429] * 85    # 20 failures for the account in all
    assert details == {"Too many failed logins for this account; try again in 2 s."}
    status, body, headers = login(guarded, PASSWORD, client="198.51.100.200")   # the user, from a fresh address
    _, wait = refusal(status, body, headers)

    clock[0] += wait + 0.5                                                # the lockout window is over
    assert login(guarded, PASSWORD, client="198.51.100.200")[0] == 200
    assert login(guarded, "wrong-password", client="198.51.100.201")[0] == 400   # the success cleared the account


def test_serve_keys_a_loopback_header_by_the_connection_by_default(ctx):
    app, url = serve(ctx, port=free_port(), auth=f"{USER}:{PASSWORD}", open_browser=False, block=False)
    try:                                  # serve's own throttle (real clock): 5 tries, then 2 s refused
        statuses = [login(url, "wrong-password", client=f"10.8.0.{i}")[0] for i in range(6)]
    finally:
        app.close()
    assert statuses == [400] * 5 + [429]


def scope(client: str, *forwarded: str) -> dict:
    return {"client": (client, 0), "headers": [(b"x-forwarded-for", value.encode()) for value in forwarded]}


def test_client_key_uses_the_connection_or_the_tunnels_last_entry_never_an_earlier_one():
    # no header: the connection (loopback ones are one key)
    assert client_key(scope("203.0.113.5"), tunnel=False) == "203.0.113.5"
    assert client_key(scope("127.0.0.1"), tunnel=True) == client_key(scope("::1"), tunnel=False) == "loopback"
    # uvicorn took an address from a loopback request's header (here as it would: the last untrusted entry)
    assert client_key(scope("10.0.0.7", "1.1.1.1, 10.0.0.7"), tunnel=False) == "loopback"
    assert client_key(scope("10.0.0.7", "1.1.1.1, 10.0.0.7"), tunnel=True) == "10.0.0.7"
    assert client_key(scope("10.0.0.7", "1.1.1.1", "10.0.0.7:4242"), tunnel=True) == "10.0.0.7"
    assert client_key(scope("2001:db8::1", "[2001:db8::1]:80"), tunnel=False) == "loopback"
    # an earlier entry (uvicorn skips a trusted last one, or trusts everything): never the key
    assert client_key(scope("1.1.1.1", "1.1.1.1, 127.0.0.1"), tunnel=True) == "loopback"
    assert client_key(scope("1.1.1.1", "1.1.1.1, 10.0.0.7"), tunnel=True) == "loopback"
    # a direct connection from elsewhere keeps its address, whatever header it sends
    assert client_key(scope("203.0.113.5", "10.0.0.1"), tunnel=True) == "203.0.113.5"
    assert client_key({"client": None, "headers": []}, tunnel=False) == "?"


def test_the_account_budget_spans_clients_doubles_and_clears():
    now = [0.0]
    throttle = LoginThrottle(free=3, base_s=1.0, cap_s=5.0, forget_s=60.0, account_free=6, account_forget_s=600.0,
                             clock=lambda: now[0])
    assert [throttle.attempt(f"c{i}") for i in range(6)] == [0.0] * 6            # six clients, one failure each
    assert throttle.account_wait() == 1.0 and throttle.wait("someone-new") == 1.0
    assert throttle.attempt("someone-new") == 1.0 and throttle.wait("c0") == 1.0
    waits = []
    for _ in range(4):
        now[0] += throttle.wait("x")
        assert throttle.attempt(f"other{now[0]}") == 0.0
        waits.append(throttle.account_wait())
    assert waits == [2.0, 4.0, 5.0, 5.0]
    now[0] += 601.0                                       # ten minutes without an attempt: a fresh start
    assert throttle.account_wait() == 0.0
    assert [throttle.attempt(f"d{i}") for i in range(6)] == [0.0] * 6 and throttle.account_wait() == 1.0
    now[0] += 1.0
    assert throttle.attempt("d0") == 0.0
    throttle.succeeded("d0")                              # a real login clears the account's count
    assert throttle.account_wait() == 0.0 and throttle.wait("d1") == 0.0
    assert throttle.wait("d0") == 0.0 and throttle.attempt("d2") == 0.0
