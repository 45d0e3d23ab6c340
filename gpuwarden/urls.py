"""URLs as they may be shown: credentials in a URL (``http://user:password@host``) never reach a terminal or a log."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redacted(url: str) -> str:
    """Return ``url`` with its password replaced by ``***`` (``http://user:***@host:port/path``); a URL without a
    password, or one that does not parse, is returned as it is (it holds no password to hide)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
