"""The gate in front of the app: basic auth when the web config has users, the app itself when not, switched at
once on reload (bcrypt is imported only once users are configured: gpuwarden.web.auth)."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send


class AuthGate:
    """The app behind basic auth when users are configured, the app itself when not; ``set_users`` switches
    between them at once (configuration reload), so auth can be turned on, changed and off by SIGHUP."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.inner: ASGIApp = app
        self._auth: Any = None

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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the connection to the app, through auth when users are configured."""
        await self.inner(scope, receive, send)
