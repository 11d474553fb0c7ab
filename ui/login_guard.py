"""Before a login, nothing but the login page; failed logins back off per client.

With `--auth`, Gradio (6.31) still serves `/` to anyone with the app's API description embedded
(every endpoint, and their defaults: the projects root), and leaves some routes open
(`/openapi.json`). `LoginGuard` sits in front of the app and lets a request without a live login
reach only what the login page needs: `GET /` with the API description blanked (the page is
refused, 503, if that cannot be done), the frontend's own files (`/assets/`, `/static/`,
`/theme.css`, `/favicon.ico`), Gradio's startup probe and `POST /login`. Anything else answers
401. A request that carries the session cookie of a live login (Gradio's `access-token-*` cookie,
a key of `app.tokens`) passes untouched.

`LoginThrottle` counts failed logins per client address (as uvicorn reports it: a proxy's
`X-Forwarded-For` only when the proxy is on loopback, as the share tunnel is). Every attempt counts
as a failure until it succeeds, so a burst of parallel guesses is counted too. After `free`
failures a client is refused (429, `Retry-After`) for `base_s`, doubling with each further failure
up to `cap_s`; a success, or `forget_s` without an attempt, clears the count.
"""
from __future__ import annotations

import json
import math
import re
import time
from typing import Any, Awaitable, Callable

from starlette.requests import HTTPConnection

__all__ = ["LoginGuard", "LoginThrottle"]

Scope = dict[str, Any]
Send = Callable[[dict[str, Any]], Awaitable[None]]

LOGIN_PATHS = ("/login", "/login/")
ASSET_PREFIXES = ("/assets/", "/static/")
# plus the startup probe Gradio's own launch() sends before anyone logs in (it answers true or false)
ASSET_FILES = ("/theme.css", "/favicon.ico", "/gradio_api/startup-events")
# the page's embedded API description (Gradio's index.html; `<` is escaped inside the JSON, so the first
# `;</script>` ends it)
API_INFO = re.compile(rb"(<script>window\.gradio_api_info = ).*?(;</script>)", re.DOTALL)


class LoginThrottle:
    """Failed logins per client and the wait they impose (see the module's text)."""

    def __init__(self, free: int = 5, base_s: float = 2.0, cap_s: float = 300.0, forget_s: float = 900.0,
                 clock: Callable[[], float] = time.monotonic):
        self.free, self.base_s, self.cap_s, self.forget_s, self.clock = free, base_s, cap_s, forget_s, clock
        self._clients: dict[str, tuple[int, float, float]] = {}     # client -> (failures, refused until, last)

    def _entry(self, client: str, now: float) -> tuple[int, float, float]:
        entry = self._clients.get(client, (0, 0.0, now))
        return (0, 0.0, now) if now - entry[2] > self.forget_s and now >= entry[1] else entry

    def wait(self, client: str) -> float:
        """Seconds until `client` may try again; 0 when it may now."""
        now = self.clock()
        return max(0.0, self._entry(client, now)[1] - now)

    def attempt(self, client: str) -> float:
        """Count an attempt, as a failure until `succeeded`; returns the wait in force (the attempt is
        then refused and not counted), 0 when it may go ahead."""
        now = self.clock()
        failures, until, _ = self._entry(client, now)
        if until > now:
            return until - now
        failures += 1
        if failures >= self.free:
            until = now + min(self.cap_s, self.base_s * 2 ** (failures - self.free))
        if len(self._clients) > 10_000:         # many addresses: drop those that are neither refused nor recent
            self._clients = {c: e for c, e in self._clients.items() if e[1] > now or now - e[2] <= self.forget_s}
        self._clients[client] = (failures, until, now)
        return 0.0

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)


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
        client = (scope.get("client") or ("?", 0))[0]
        wait = self.throttle.attempt(client)
        if wait > 0:
            seconds = math.ceil(wait)
            await _respond(send, 429, f"Too many failed logins from this address; try again in {seconds} s.",
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
