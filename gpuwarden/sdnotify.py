"""systemd service notifications (sd_notify(3)): READY=1, WATCHDOG=1, STOPPING=1, STATUS=.

The protocol, as sd_notify(3) and systemd's "Notify socket" documentation describe it: when the service
runs with ``Type=notify``, systemd puts the path of a Unix datagram socket in ``NOTIFY_SOCKET`` (a leading
``@`` means the Linux abstract namespace); the service sends newline-separated ``KEY=VALUE`` assignments
as one datagram. With ``WatchdogSec=``, systemd sets ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``) and restarts
the service unless ``WATCHDOG=1`` arrives at least that often. These few lines stand in for a library:
the ``sdnotify`` package on PyPI has had no release since 2017, and ``systemd-python`` needs libsystemd
headers to build.

Without ``NOTIFY_SOCKET`` (not under systemd), every call is a no-op that returns False.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify messages to the socket named by ``NOTIFY_SOCKET`` in ``env`` (default os.environ).

    ``enabled`` is False when there is no (usable) socket. ``watchdog_seconds`` is systemd's watchdog
    timeout (WATCHDOG_USEC in seconds) when the watchdog is on for this process, else None.
    Sending never raises: a failure is logged once at debug level and the call returns False.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        path = env.get("NOTIFY_SOCKET", "")
        self._address: str | None = None
        if path.startswith("@"):
            self._address = "\0" + path[1:]
        elif path.startswith("/"):
            self._address = path
        elif path:
            log.debug("NOTIFY_SOCKET %r is not a Unix socket path; sd_notify disabled", path)
        self.watchdog_seconds: float | None = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_seconds = int(usec) / 1e6
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        """True when a notify socket is configured."""
        return self._address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` assignments in one datagram; return True when sent."""
        if self._address is None:
            return False
        message = "\n".join(assignments).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(message, self._address)
                return True
            except OSError as exc:
                log.debug("sd_notify %s failed: %s", assignments, exc)
                return False

    def ready(self, status: str | None = None) -> bool:
        """READY=1: start-up finished (and STATUS= when given)."""
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        """WATCHDOG=1: the service is alive (only sent when systemd's watchdog is on)."""
        return self.watchdog_seconds is not None and self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        """STOPPING=1: the service is shutting down."""
        return self.notify("STOPPING=1")

    def status(self, text: str) -> bool:
        """STATUS=text: a one-line state shown by ``systemctl status``."""
        return self.notify(f"STATUS={text}")

    def close(self) -> None:
        """Close the socket (a later call opens it again)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
