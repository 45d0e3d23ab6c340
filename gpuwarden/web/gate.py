"""The gate in front of the app: the web config's rate limit, then basic auth when the web config has users, the app
itself when not, switched at once on reload (bcrypt is imported only once users are configured: gpuwarden.web.auth).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send


class TokenBucket:
    """golang.org/x/time/rate's limiter as the exporter-toolkit uses it (``rate.NewLimiter(rate.Every(interval),
    burst)`` and ``Allow()``): ``burst`` tokens at first, one more each ``interval_s`` seconds up to ``burst``.

    Written here rather than taken from a library: the Python rate limiters (limits, aiolimiter) count fixed or
    moving windows or make callers wait, and a web config must mean here what it means to node_exporter.
    ``clock``: seconds, monotonic (tests pass their own)."""

    def __init__(self, interval_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.burst, self._clock = interval_s, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def allow(self) -> bool:
        """Take a token if there is one: True, else False (the request is refused)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) / self.interval_s)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


#: The answer to a request past the rate limit, as the exporter-toolkit gives it (net/http's http.Error text).
TOO_MANY = PlainTextResponse("Too Many Requests\n", status_code=429)


class AuthGate:
    """The app behind the rate limit (``set_rate_limit``) and basic auth when users are configured, the app itself
    when not; ``set_users`` switches between them at once (configuration reload), so auth can be turned on, changed
    and off by SIGHUP."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.inner: ASGIApp = app
        self._auth: Any = None
        self._limit: tuple[float, int] = (0.0, 0)
        self._bucket: TokenBucket | None = None

    def set_users(self, users: dict[str, bytes]) -> None:
        """Use ``users`` from the next request on (empty: no auth). Raises ValueError on a hash that is not bcrypt."""
        if not users:
            self.inner = self.app
            return
        if self._auth is None:
            from gpuwarden.web.auth import BasicAuthMiddleware  # bcrypt only where users are configured

            self._auth = BasicAuthMiddleware(self.app, users)
        else:
            self._auth.set_users(users)
        self.inner = self._auth

    def set_rate_limit(self, interval_s: float, burst: int) -> None:
        """Limit every request from the next one on to a bucket of ``burst`` tokens refilled one per ``interval_s``
        seconds (0: no limit). The same limit again keeps its bucket (a reload hands out no fresh burst); a changed
        one starts full."""
        if (interval_s, burst) == self._limit:
            return
        self._limit = (interval_s, burst)
        self._bucket = TokenBucket(interval_s, burst) if interval_s > 0 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the connection to the app, past the rate limit (429 without a token) and through auth when users
        are configured."""
        if scope["type"] == "http" and self._bucket is not None and not self._bucket.allow():
            await TOO_MANY(scope, receive, send)
            return
        await self.inner(scope, receive, send)
