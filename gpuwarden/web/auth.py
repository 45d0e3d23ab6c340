"""HTTP basic auth (RFC 7617) against bcrypt hashes, as exporter-toolkit does it, for the users of the web config
(``basic_auth_users`` in gpuwarden.web.config; gpuwarden.web.gate switches it on and off)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import secrets
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator

import bcrypt
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuwarden.web.config import BCRYPT_HASH, DEFAULT_OPEN_PATHS, REALM

log = logging.getLogger(__name__)


def _credentials(header: bytes | None) -> tuple[bytes, str, bytes] | None:
    """The user (as sent, and decoded from UTF-8) and password of a raw ``Authorization: Basic`` value (RFC 7617),
    or None for any other scheme, bad base64, no colon or a user name that is not UTF-8."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user_b, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user_b, user_b.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


class BasicAuthMiddleware:
    """ASGI middleware: HTTP basic auth (RFC 7617) against bcrypt hashes, as exporter-toolkit does it.

    ``users`` maps a user name to its bcrypt hash (bytes). A request to a path in ``open_paths`` (exact
    match, see :data:`DEFAULT_OPEN_PATHS` for why ``/healthz`` and ``/readyz``) passes without credentials;
    any other request without a valid ``Authorization: Basic`` header gets 401 with
    ``WWW-Authenticate: Basic realm="gpuwarden"``. Lifespan events pass through; websocket connections are
    treated like requests (closed with 1008 when not authorized).

    Costs and safety:

    * bcrypt (tens to hundreds of ms at cost 10-12) runs in a worker thread, one at a time, so a burst of bad
      passwords neither blocks the event loop (/healthz keeps answering) nor uses more than one core.
    * A successful check is cached under an HMAC-SHA256 of (user, hash, password) with a per-process random
      key, so a scraper pays bcrypt once, not every 15 s, and no password is kept in memory in the clear.
      The cache holds at most ``cache_size`` entries (least recently used evicted); failures are not cached.
    * An unknown user is checked against a dummy hash of the highest cost in use, and a user whose hash costs less
      against the dummy hash too, so every check not served from the cache does the work of the highest cost and
      response time does not reveal which user names exist, whatever their costs (the same work, not a sleep to a
      time measured once: a loaded machine slows every check alike).
    * Checks wait for bcrypt in two lanes, and in each lane the source addresses take turns: one check for every
      address with checks waiting, then round again, so a crowd from one address waits behind its own checks (fair
      queuing by source, as the handshakes are bounded: gpuwarden.web.server.accept). A connection that has failed
      a check before (a guesser on keep-alive), or was refused because its address's place in the first lane was
      full, waits in the second lane, served only when the first is empty, one check in line per connection
      (``max_waiting_failed`` in all). Any other request (a scraper's new connection, after a restart or a password
      change) waits in the first, at most ``max_waiting`` of them an address (past that: 401 at once, and the
      connection moves to the second lane). However many guessers an address has, a right password from another
      address waits for the check in progress and at most one check of each other address with checks in its lane.
      Failed connections are remembered by client address and port, the last ``remembered_failures`` of them.
      Guessers spread over many addresses each take their turn; bound them upstream (a proxy's per-source limit).
    * Nothing secret is logged: failures are logged at debug level with path and client address only.
    """

    def __init__(
        self,
        app: ASGIApp,
        users: dict[str, bytes],
        open_paths: set[str] | frozenset[str] = DEFAULT_OPEN_PATHS,
        cache_size: int = 256,
        max_waiting: int = 4,
        remembered_failures: int = 4096,
        max_waiting_failed: int = 1024,
    ) -> None:
        self.app = app
        self.open_paths = frozenset(open_paths)
        self.cache_size = cache_size
        self.max_waiting = max_waiting
        self.max_waiting_failed = max_waiting_failed
        self._waiting: set[tuple[str, int]] = set()  # connections with a check in the second lane
        self.remembered_failures = remembered_failures
        self._failed: OrderedDict[tuple[str, int], None] = OrderedDict()  # connections that failed a check
        self.users: dict[str, bytes] = {}
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._lanes = _Lanes()
        self.set_users(users)

    def set_users(self, users: dict[str, bytes]) -> None:
        """Replace the users (configuration reload); the cache of verified credentials is kept when the users are
        the same, emptied otherwise. Raises ValueError on a non-bcrypt hash. An empty ``users`` turns auth off."""
        if users == self.users and hasattr(self, "_dummy"):
            return
        costs = []
        for user, hashed in users.items():
            match = BCRYPT_HASH.match(hashed.decode("ascii", "replace"))
            if not match:
                raise ValueError(f"the password of {user!r} is not a bcrypt hash")
            costs.append(int(match.group(1)))
        # An unknown user is checked against this hash, at the highest cost in use, and a user whose hash costs less
        # against it too: every check does the work of the highest cost, so no timing tells the users apart.
        self._top_cost = max(costs, default=4)
        self._dummy = bcrypt.hashpw(secrets.token_bytes(16).hex().encode(), bcrypt.gensalt(self._top_cost))
        self.users = dict(users)
        with self._cache_lock:
            self._cache.clear()

    def _cache_key(self, user: bytes, hashed: bytes, password: bytes) -> bytes:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (user, hashed, password):
            mac.update(len(part).to_bytes(4, "big"))
            mac.update(part)
        return mac.digest()

    async def authorized(self, header: bytes | None, client: tuple[str, int] | None = None) -> bool:
        """Return True when ``header`` (the raw Authorization value) holds a valid user and password.

        ``client`` (ASGI's ``scope["client"]``: address and port, one per connection) picks the lane the check
        waits in (the second when that connection failed a check before) and its turn among addresses.
        """
        credentials = _credentials(header) if self.users else None
        if credentials is None:
            return False
        user_b, user, password = credentials
        hashed = self.users.get(user)
        known = hashed is not None
        if hashed is None:
            hashed = self._dummy
        key = self._cache_key(user_b, hashed, password)
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return known
        lane = self._lane(client)
        if lane is None:
            return False
        try:
            async with self._lanes.turn(lane, client[0] if client is not None else ""):
                ok = await asyncio.to_thread(_checkpw, password, hashed)
                if hashed is not self._dummy and int(hashed[4:6]) < self._top_cost:
                    await asyncio.to_thread(_checkpw, password, self._dummy)  # the highest cost's work too
        finally:
            if client is not None:
                self._waiting.discard(client)
        ok = ok and known
        if ok:
            with self._cache_lock:
                self._cache[key] = None
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if client is not None:
            self._remember(client, failed=not ok)  # only a checked password moves a connection between lanes
        return ok

    def _lane(self, client: tuple[str, int] | None) -> int | None:
        """The lane a check from ``client`` waits in (0, or 1 for a connection that failed a check before; it is
        then marked waiting), or None when it is refused unchecked: its address's place in the first lane is full,
        or the connection already has a check in line."""
        lane = 1 if client is not None and client in self._failed else 0
        if lane == 0 and self._lanes.waiting(0, "" if client is None else client[0]) >= self.max_waiting:
            # a crowd of fresh connections from this address already waits: refused at once, and counted as a
            # check, so that this connection waits in the second lane next time (else a flood of them refused
            # unchecked never leaves the first lane, and keeps it full for every right password after it)
            if client is not None:
                self._remember(client, failed=True)
            return None
        if lane == 1 and (client in self._waiting or self._lanes.waiting(1) >= self.max_waiting_failed):
            return None  # one check in line per connection; all of them bounded
        if lane == 1 and client is not None:
            self._waiting.add(client)
        return lane

    def _remember(self, client: tuple[str, int], failed: bool) -> None:
        if not failed:
            self._failed.pop(client, None)
            return
        self._failed[client] = None
        self._failed.move_to_end(client)
        while len(self._failed) > self.remembered_failures:
            self._failed.popitem(last=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection: pass it on when open or authorized, else answer 401."""
        if scope["type"] not in ("http", "websocket") or scope.get("path") in self.open_paths:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        client = scope.get("client")
        if await self.authorized(header, tuple(client) if client else None):
            await self.app(scope, receive, send)
            return
        log.debug("basic auth refused: %s %s from %s", scope["type"], scope.get("path"), client[0] if client else "?")
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b"Unauthorized\n"
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"www-authenticate", f'Basic realm="{REALM}"'.encode()),
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _Lanes:
    """One bcrypt check at a time, handed to the first lane's waiters before the second's, and within a lane to the
    source addresses in turn (one check each, round again) (asyncio, one loop)."""

    def __init__(self) -> None:
        self._busy = False
        self._queues: tuple[OrderedDict[str, deque[asyncio.Future[None]]], ...] = (OrderedDict(), OrderedDict())

    def waiting(self, lane: int, source: str | None = None) -> int:
        """How many checks wait in ``lane`` (0 or 1), from ``source`` only when given."""
        queues = self._queues[lane]
        if source is not None:
            return len(queues.get(source, ()))
        return sum(len(queue) for queue in queues.values())

    @contextlib.asynccontextmanager
    async def turn(self, lane: int, source: str) -> AsyncIterator[None]:
        """Wait for the check's turn in ``lane`` among ``source``'s; hold it for the ``async with`` body."""
        if self._busy or any(self._queues):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queues[lane].setdefault(source, deque()).append(future)
            try:
                await future
            except asyncio.CancelledError:
                queue = self._queues[lane].get(source)
                if queue is not None and future in queue:
                    queue.remove(future)
                    if not queue:
                        del self._queues[lane][source]
                elif not future.cancelled():
                    self._next()  # the turn was handed over as the waiter went: pass it on
                raise
        else:
            self._busy = True
        try:
            yield
        finally:
            self._next()

    def _next(self) -> None:
        for sources in self._queues:
            while sources:
                source, queue = next(iter(sources.items()))
                future = queue.popleft()
                if queue:
                    sources.move_to_end(source)  # its next check after one of every other source's
                else:
                    del sources[source]
                if not future.done():
                    future.set_result(None)
                    return
        self._busy = False


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # bcrypt >= 5 refuses passwords over 72 bytes; no stored hash can match one
        return False
