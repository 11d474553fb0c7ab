"""Before a login, nothing but the login page; failed logins back off per client and per account.

With `--auth`, Gradio (6.31) still serves `/` to anyone with the app's API description embedded
(every endpoint, and their defaults: the projects root), and leaves some routes open
(`/openapi.json`). `LoginGuard` sits in front of the app and lets a request without a live login
reach only what the login page needs: `GET /` with the API description blanked (the page is
refused, 503, if that cannot be done), the frontend's own files (`/assets/`, `/static/`,
`/theme.css`, `/favicon.ico`), Gradio's startup probe and `POST /login`. Anything else answers
401. A request that carries the session cookie of a live login (Gradio's `access-token-*` cookie,
a key of `app.tokens`) passes untouched.

`LoginThrottle` counts failed logins twice, and refuses an attempt (429 with `Retry-After` and one
sentence saying how long to wait) while either count is over its limit:

- per client: keyed by `client_key` (below). After `free` (5) failures the client is refused for
  `base_s` (2 s), doubling with each further failure up to `cap_s` (300 s); `forget_s` (15 min)
  without an attempt clears the count.
- per account, across all clients: the app has one login (launch_policy gives one user:password), so
  this is one count for every `POST /login`, whatever its address. After `account_free` (20: four
  clients' worth of typos) failures every client is refused for `base_s`, doubling up to `cap_s`;
  `account_forget_s` (1 h) without an attempt clears it. This bounds the guesses the whole world gets
  (20 at once, then about one per `cap_s`; at most 20 an hour by waiting for the count to clear),
  however many addresses they come from or seem to. The price: while such an attack goes on, the real
  user may have to wait too (at most `cap_s`).

Every attempt counts as a failure until it succeeds, so a burst of parallel guesses is counted too; a
refused attempt is not counted. A successful login clears its client's count and the account's (an
attacker gains at most `account_free` more guesses per real login).

What is keyed by what (`client_key`): uvicorn (as Gradio runs it) replaces the connection's address with
an `X-Forwarded-For` entry when the connection comes from loopback, as the share tunnel's does; the
tunnel appends its own client's address as the header's last entry, and any earlier entry is whatever
that client sent. So:

- no `X-Forwarded-For`: the connection's address;
- an app with a share tunnel (`tunnel=True`), and uvicorn took the header's last entry: that entry,
  the address the tunnel saw;
- any other address uvicorn took from the header (no tunnel, or an earlier entry): the connection,
  which was loopback: the key `loopback`, the same as a loopback request without the header (a
  remote client whose header names its own address is keyed so too: that buys nothing either).

Hence a header cannot buy fresh tries: without a tunnel it is never a key; with one, only its last entry
is, which a client going through the tunnel cannot choose; a local process that poses as the tunnel can
(nothing tells it apart), and the account count holds it like everyone else.
"""
from __future__ import annotations

import ipaddress
import json
import math
import re
import time
from typing import Any, Awaitable, Callable

from starlette.requests import HTTPConnection

__all__ = ["LoginGuard", "LoginThrottle", "client_key"]

Scope = dict[str, Any]
Send = Callable[[dict[str, Any]], Awaitable[None]]

LOGIN_PATHS = ("/login", "/login/")
ASSET_PREFIXES = ("/assets/", "/static/")
# plus the startup probe Gradio's own launch() sends before anyone logs in (it answers true or false)
ASSET_FILES = ("/theme.css", "/favicon.ico", "/gradio_api/startup-events")
# the page's embedded API description (Gradio's index.html; `<` is escaped inside the JSON, so the first
# `;</script>` ends it)
API_INFO = re.compile(rb"(<script>window\.gradio_api_info = ).*?(;</script>)", re.DOTALL)


Entry = tuple[int, float, float]                    # (failures, refused until, last counted attempt)


def _host_candidates(entry: str) -> set[str]:
    """Every host uvicorn may take from one `X-Forwarded-For` entry (`h`, `h:port`, `[h]`, `[h]:port`)."""
    hosts = {entry}
    if entry.startswith("[") and "]" in entry:
        hosts.add(entry[1:entry.index("]")])
    elif entry.count(":") == 1:
        hosts.add(entry.split(":")[0])
    return hosts


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_key(scope: Scope, tunnel: bool) -> str:
    """The key a login attempt is counted under (see the module's text): the connection's address, the
    tunnel's last `X-Forwarded-For` entry when `tunnel`, else `loopback` for anything taken from the header."""
    host = (scope.get("client") or ("?", 0))[0] or "?"
    forwarded = ", ".join(value.decode("latin-1") for name, value in scope.get("headers", [])
                          if name.lower() == b"x-forwarded-for")
    entries = [entry.strip() for entry in forwarded.split(",")] if forwarded else []
    if any(host in _host_candidates(entry) for entry in entries):     # uvicorn took it from the header
        return host if tunnel and host in _host_candidates(entries[-1]) else "loopback"
    return "loopback" if _is_loopback(host) else host


class LoginThrottle:
    """Failed logins per client and per account, and the wait they impose (see the module's text).
    `tunnel`: the app has a share tunnel, whose last `X-Forwarded-For` entry names its client."""

    def __init__(self, free: int = 5, base_s: float = 2.0, cap_s: float = 300.0, forget_s: float = 900.0,
                 account_free: int = 20, account_forget_s: float = 3600.0, tunnel: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self.free, self.base_s, self.cap_s, self.forget_s, self.clock = free, base_s, cap_s, forget_s, clock
        self.account_free, self.account_forget_s, self.tunnel = account_free, account_forget_s, tunnel
        self._clients: dict[str, Entry] = {}
        self._account: Entry | None = None

    @staticmethod
    def _current(entry: Entry | None, now: float, forget_s: float) -> Entry:
        if entry is None or (now - entry[2] > forget_s and now >= entry[1]):
            return (0, 0.0, now)
        return entry

    def _failed(self, entry: Entry, free: int, now: float) -> Entry:
        failures, until = entry[0] + 1, entry[1]
        if failures >= free:
            until = now + min(self.cap_s, self.base_s * 2 ** (failures - free))
        return (failures, until, now)

    def _entries(self, client: str, now: float) -> tuple[Entry, Entry]:
        return (self._current(self._clients.get(client), now, self.forget_s),
                self._current(self._account, now, self.account_forget_s))

    def wait(self, client: str) -> float:
        """Seconds until `client` may try again (its own wait or the account's); 0 when it may now."""
        now = self.clock()
        return max(0.0, *(entry[1] - now for entry in self._entries(client, now)))

    def account_wait(self) -> float:
        """Seconds until anyone may try again because of the account's count; 0 when it does not hold them."""
        now = self.clock()
        return max(0.0, self._current(self._account, now, self.account_forget_s)[1] - now)

    def attempt(self, client: str) -> float:
        """Count an attempt, as a failure until `succeeded`, for `client` and the account; returns the wait
        in force (the attempt is then refused and not counted), 0 when it may go ahead."""
        now = self.clock()
        mine, account = self._entries(client, now)
        until = max(mine[1], account[1])
        if until > now:
            return until - now
        if len(self._clients) > 10_000:         # many addresses: drop those that are neither refused nor recent
            self._clients = {c: e for c, e in self._clients.items() if e[1] > now or now - e[2] <= self.forget_s}
        self._clients[client] = self._failed(mine, self.free, now)
        self._account = self._failed(account, self.account_free, now)
        return 0.0

    def succeeded(self, client: str) -> None:
        """The password was right: clear `client`'s count and the account's."""
        self._clients.pop(client, None)
        self._account = None


async def _respond(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class LoginGuard:
    """ASGI middleware in front of a Gradio app that has `auth` (installed by ui.app.serve)."""

    def __init__(self, app: Callable, throttle: LoginThrottle):
        self.app, self.throttle = app, throttle

    async def __call__(self, scope: Scope, receive: Callable, send: Send) -> None:
        gradio_app = scope.get("app")            # Starlette puts the app in the scope before its middleware
        if scope["type"] not in ("http", "websocket") or getattr(gradio_app, "auth", None) is None \
                or self._logged_in(scope, gradio_app):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        path, method = self._path(scope), scope.get("method", "GET")
        if path in LOGIN_PATHS and method == "POST":
            await self._login(scope, receive, send)
        elif path == "/" and method == "GET":
            await self._login_page(scope, receive, send)
        elif method in ("GET", "HEAD") and (path == "/" or path.startswith(ASSET_PREFIXES) or path in ASSET_FILES):
            await self.app(scope, receive, send)
        else:
            await _respond(send, 401, "Not authenticated: log in first.")

    @staticmethod
    def _path(scope: Scope) -> str:
        path, root = scope.get("path", "/"), scope.get("root_path", "")
        return (path[len(root):] or "/") if root and path.startswith(root) else path

    @staticmethod
    def _logged_in(scope: Scope, gradio_app: Any) -> bool:
        cookies = HTTPConnection(scope).cookies
        cookie_id = getattr(gradio_app, "cookie_id", None)
        token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
        return bool(token) and token in getattr(gradio_app, "tokens", {})

    async def _login(self, scope: Scope, receive: Callable, send: Send) -> None:
        client = client_key(scope, self.throttle.tunnel)
        wait = self.throttle.attempt(client)
        if wait > 0:
            seconds = math.ceil(wait)
            whose = "for this account" if self.throttle.account_wait() >= wait else "from this address"
            await _respond(send, 429, f"Too many failed logins {whose}; try again in {seconds} s.",
                           {"retry-after": str(seconds)})
            return
        status = 0

        async def watch(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
        await self.app(scope, receive, watch)
        if status == 200:
            self.throttle.succeeded(client)

    async def _login_page(self, scope: Scope, receive: Callable, send: Send) -> None:
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def keep(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
        await self.app(scope, receive, keep)
        body, found = API_INFO.subn(rb"\1null\2", b"".join(chunks))
        if start.get("status") != 200 or found != 1:
            await _respond(send, 503, "The login page cannot be served without the app's API description "
                                      "(an unexpected Gradio page); the app refuses to show it.")
            return
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
