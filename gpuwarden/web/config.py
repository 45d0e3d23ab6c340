"""TLS, mutual TLS and basic auth from an exporter-toolkit web config file (``--web.config.file``).

The file format is the one node_exporter and every exporter built on prometheus/exporter-toolkit read
(``docs/web-configuration.md`` in github.com/prometheus/exporter-toolkit), so the file an operator already
has for node_exporter works here unchanged::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to the web config file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      prometheus: $2b$12$...          # bcrypt hash

What differs from the Go implementation, and why (each refusal is a one-line :class:`WebConfigError` at
start-up rather than a setting that is silently not enforced):

* ``client_auth_type: RequireAnyClientCert`` (and its old name ``RequireClientCert``) is refused: Python's
  ``ssl`` module cannot require a client certificate without verifying it. Use RequireAndVerifyClientCert.
* ``RequestClientCert`` asks for a certificate that is never checked; the exporter does not use the client's
  identity, so it is served as ``NoClientCert`` (``ssl.CERT_NONE``): the same access decision.
* ``rate_limit`` is served as the toolkit does (one token bucket for every request the server answers, a refused
  request answered 429), but ``burst: 0`` with an interval, which refuses every request (the probes' and the
  scrapes' too), is refused at start-up.
* ``client_allowed_sans``, ``cipher_suites``, ``curve_preferences`` and inline ``cert``/``key``/
  ``client_ca`` are refused: they restrict access or need features Python's ssl module does not offer, and ignoring them
  would be weaker than what the file asks for.
* ``http_server_config.http2`` is accepted and has no effect (gpuwarden serves HTTP/1.1).
* The Go toolkit re-reads the file on every request. Here it is read at start-up; certificate rotation at the
  same paths is picked up by :meth:`WebConfig.reload_certificates` (call it on SIGHUP), and users by
  :meth:`gpuwarden.web.auth.BasicAuthMiddleware.set_users`.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from gpuwarden.config import ConfigError, open_regular, read_yaml

log = logging.getLogger(__name__)


REALM = "gpuwarden"

#: Paths answered without credentials. ``/healthz`` and ``/readyz`` are what the kubelet (and load balancers)
#: probe, and a probe cannot carry credentials unless the password is written in clear text into the pod spec
#: (``httpGet.httpHeaders`` cannot read a Secret). Their bodies say only "ok" and how old the last poll is:
#: no GPU, process, host or pod data. Everything else, ``/metrics``, ``/api/v1/gpus``, ``/``, ``/docs`` and
#: ``/openapi.json``, needs credentials. Matching is exact (no prefixes, no trailing slash variants).
DEFAULT_OPEN_PATHS: frozenset[str] = frozenset({"/healthz", "/readyz"})

ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
TLSVersionName = Literal["TLS10", "TLS11", "TLS12", "TLS13"]

_TLS_VERSIONS: dict[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CERT_REQS: dict[str, ssl.VerifyMode] = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# The headers exporter-toolkit allows in http_server_config.headers (validateHeaderConfig).
_ALLOWED_HEADERS = (
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
)
#: Modular crypt format of bcrypt as the bcrypt package verifies it: $2a$/$2b$/$2y$, two-digit cost, 22 salt + 31 hash
# characters ($2$ and $2x$ hashes can never match: refused rather than locking their user out).
BCRYPT_HASH = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
#: The highest bcrypt cost accepted. Each check doubles in time per cost step (about 0.2 s at 12 and 0.85 s at 14
#: on a server core): above 14 a single login outlasts Prometheus's scrape timeout, and a cost of 31 hashes for days.
MAX_BCRYPT_COST = 14
# Header values exporter-toolkit allows where it restricts them (validateHeaderConfig).
_HEADER_VALUES = {"X-Frame-Options": ("deny", "sameorigin"), "X-Content-Type-Options": ("nosniff",)}


class WebConfigError(ConfigError):
    """The web config file cannot be used; ``str()`` is one line that names the file and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TLSServerConfig(_Strict):
    """``tls_server_config``: server certificate, client certificate policy and protocol versions.

    File names are resolved against the web config file's directory by :func:`load_web_config`.
    """

    cert_file: Path | None = None
    key_file: Path | None = None
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: TLSVersionName = "TLS12"
    max_version: TLSVersionName = "TLS13"
    prefer_server_cipher_suites: bool = True
    # Known to exporter-toolkit but not supported here: declared so the error says so instead of "unknown key".
    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None
    client_allowed_sans: list[str] | None = None
    cipher_suites: list[str] | None = None
    curve_preferences: list[str] | None = None

    @property
    def enabled(self) -> bool:
        """True when any TLS setting is present (exporter-toolkit's ``TLSConfig.IsEnabled``)."""
        return any(
            v is not None for v in (self.cert_file, self.key_file, self.client_ca_file, self.cert, self.key)
        ) or ("client_auth_type" in self.model_fields_set)

    @property
    def cert_reqs(self) -> ssl.VerifyMode:
        """The ``ssl.CERT_*`` value of ``client_auth_type``."""
        return _CERT_REQS[self.client_auth_type]


class HTTPServerConfig(_Strict):
    """``http_server_config``: ``http2`` (accepted, no effect: gpuwarden serves HTTP/1.1) and extra response headers."""

    http2: bool = True
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _known_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if name not in _ALLOWED_HEADERS:
                raise ValueError(f"header {name!r} is not one of {', '.join(_ALLOWED_HEADERS)}")
            if any(ord(c) < 32 or ord(c) == 127 for c in text):
                raise ValueError(f"header {name!r}: the value holds a control character (CR, LF, ...)")
            if not text.isascii():  # HTTP field values are bytes, sent as ASCII
                raise ValueError(f"header {name!r}: the value must be ASCII text")
            allowed = _HEADER_VALUES.get(name)
            if allowed is not None and text.lower() not in allowed:
                raise ValueError(f"header {name!r}: the value must be one of {', '.join(allowed)}")
        return value


#: The units of Go's time.ParseDuration, which the exporter-toolkit reads ``rate_limit.interval`` with; durationpy
#: reads Go's syntax and a few units more (d, w, mm, y), which the toolkit would refuse.
_GO_UNITS = frozenset({"ns", "us", "\u00b5s", "\u03bcs", "ms", "s", "m", "h"})


class RateLimit(_Strict):
    """``rate_limit``: one token bucket for every request the server answers (golang.org/x/time/rate, as the
    exporter-toolkit's handler uses it): ``burst`` tokens at first, one more every ``interval`` up to ``burst``; a
    request that finds no token is answered 429 Too Many Requests, before authentication. ``interval`` is a Go
    duration (``1s``, ``100ms``, ``1m30s``); 0 or absent turns the limit off."""

    interval: str | int = 0
    burst: int = Field(default=0, ge=0)

    @field_validator("interval")
    @classmethod
    def _go_duration(cls, value: str | int) -> str | int:
        if isinstance(value, int):
            if value != 0:
                raise ValueError("a bare number is not a duration; write it with its unit (1s, 500ms)")
            return value
        import durationpy

        try:
            durationpy.from_str(value)
        except durationpy.DurationError:
            raise ValueError(f"{value!r} is not a duration (1s, 500ms, 1m30s)") from None
        units = set(re.findall(r"[^\d.+-]+", value))
        if not units <= _GO_UNITS:
            raise ValueError(f"{value!r}: {', '.join(sorted(units - _GO_UNITS))} is not a unit of Go's durations")
        if value.startswith("-"):
            raise ValueError(f"{value!r} is negative")
        return value

    @property
    def interval_seconds(self) -> float:
        """The interval in seconds (0: no limit)."""
        if isinstance(self.interval, int):
            return 0.0
        import durationpy

        return float(durationpy.from_str(self.interval).total_seconds())


class WebConfig(_Strict):
    """A parsed, validated web config. The default instance (an empty file) means plain HTTP, no auth.

    Build it with :func:`load_web_config`, which also checks that certificates and keys load and that every
    password is a bcrypt hash.
    """

    tls_server_config: TLSServerConfig = Field(default_factory=TLSServerConfig)
    http_server_config: HTTPServerConfig = Field(default_factory=HTTPServerConfig)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)
    rate_limit: RateLimit = Field(default_factory=RateLimit)

    # The SSL contexts the server handshakes with (listener_context), for reload_certificates().
    _contexts: list[ssl.SSLContext] = PrivateAttr(default_factory=list)
    # The context handshakes switch to after a reload (None: the listener's own); replaced whole, never edited.
    _current: ssl.SSLContext | None = PrivateAttr(default=None)

    @property
    def tls_enabled(self) -> bool:
        """True when the server speaks HTTPS."""
        return self.tls_server_config.enabled

    @property
    def users(self) -> dict[str, bytes]:
        """``basic_auth_users`` as gpuwarden.web.auth.BasicAuthMiddleware takes them (user -> bcrypt hash bytes)."""
        return {user: hashed.encode("ascii") for user, hashed in self.basic_auth_users.items()}

    def response_headers(self) -> list[tuple[bytes, bytes]]:
        """The extra response headers (``http_server_config.headers``) as the server writes them: (name, value)
        byte pairs, ASCII (checked when the file was read)."""
        return [
            (name.lower().encode("ascii"), value.encode("ascii"))
            for name, value in self.http_server_config.headers.items()
        ]

    def listener_context(self) -> ssl.SSLContext | None:
        """The SSLContext the server handshakes with (None without TLS): :meth:`server_context`, whose handshakes
        move to the context the last :meth:`reload_certificates` built. Raises WebConfigError when a file no longer
        loads."""
        if not self.tls_enabled:
            return None
        context = self.server_context()
        context.sni_callback = self._switch_context
        self._contexts.append(context)
        return context

    def _switch_context(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        # OpenSSL's servername callback runs for every ClientHello, with or without SNI: each new handshake moves
        # to the context the last reload built, so a reload never edits a context that handshakes are reading.
        current = self._current
        if current is not None:
            connection.context = current

    def tune(self, context: ssl.SSLContext) -> None:
        """Apply ``min_version``, ``max_version`` and ``prefer_server_cipher_suites`` to ``context``."""
        tls = self.tls_server_config
        context.minimum_version = _TLS_VERSIONS[tls.min_version]
        context.maximum_version = _TLS_VERSIONS[tls.max_version]
        if tls.prefer_server_cipher_suites:
            context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE

    def server_context(self) -> ssl.SSLContext:
        """Return a new server SSLContext built from this config (what the server handshakes with: listener_context).

        Raises WebConfigError when TLS is off or a file does not load.
        """
        tls = self.tls_server_config
        if not tls.enabled:
            raise WebConfigError("web config has no tls_server_config")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.set_alpn_protocols(["http/1.1"])  # the one protocol served
        _load_chain(context, tls)
        context.verify_mode = tls.cert_reqs
        if tls.client_ca_file:
            _check_file("client_ca_file", tls.client_ca_file)
            try:
                context.load_verify_locations(cafile=str(tls.client_ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise WebConfigError(f"client_ca_file {tls.client_ca_file}: {_reason(exc)}") from exc
        self.tune(context)
        return context

    def reload_certificates(self) -> int:
        """Re-read ``cert_file``/``key_file`` (and ``client_ca_file``) into a new SSL context that every later
        handshake of the listeners uses; return how many listener contexts now switch to it (0 without TLS).

        New connections get the new certificate; open ones keep theirs (certificate rotation by cert-manager or
        certbot writes new files at the same paths). The new context is built whole, then swapped in by one
        assignment (OpenSSL's servername callback moves each handshake to it): the live contexts are never
        modified while the event loop reads them. A bad or half-written pair raises WebConfigError and the running
        certificate stays in use. Callers serialise reloads (gpuwarden.daemon.Daemon.reload).
        """
        if not self.tls_server_config.enabled or not self._contexts:
            return 0
        self._current = self.server_context()
        return len(self._contexts)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _check_file(what: str, path: Path | None) -> None:
    # A FIFO or a device would block OpenSSL's read (start-up hangs with no word): only regular files are read.
    try:
        fd = open_regular(path)  # type: ignore[arg-type]
    except OSError as exc:
        raise WebConfigError(f"cannot read {what} {path}: {_reason(exc)}") from exc
    if fd is None:
        raise WebConfigError(f"cannot read {what} {path}: not a regular file")
    os.close(fd)


def _load_chain(context: ssl.SSLContext, tls: TLSServerConfig) -> None:
    for what, path in (("cert_file", tls.cert_file), ("key_file", tls.key_file)):
        _check_file(what, path)
    try:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except ssl.SSLError as exc:
        raise WebConfigError(
            f"cert_file {tls.cert_file} and key_file {tls.key_file} do not load as a PEM certificate and its "
            f"private key: {_reason(exc)}"
        ) from exc
    except OSError as exc:
        raise WebConfigError(f"cannot load cert_file/key_file: {_reason(exc)}") from exc


def _format_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            parts.append(f"{where}: unknown key")
        elif err["type"] == "literal_error":
            parts.append(f"{where}: {err['input']!r} is not one of {err['ctx']['expected']}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def _check(cfg: WebConfig) -> None:
    """Raise WebConfigError (one line) for what the models accept but gpuwarden cannot serve or would misread."""
    if cfg.rate_limit.interval_seconds > 0 and cfg.rate_limit.burst == 0:
        raise WebConfigError("rate_limit: burst 0 with an interval refuses every request (the probes' and scrapes' "
                             "too); give a burst of at least 1")  # fmt: skip
    _check_tls(cfg)
    for user, hashed in cfg.basic_auth_users.items():
        _check_user(user, hashed)


#: Settings of exporter-toolkit's tls_server_config gpuwarden refuses, and why.
_UNSUPPORTED_TLS = {
    "cert": "inline cert is not supported; use cert_file",
    "key": "inline key is not supported; use key_file",
    "client_ca": "inline client_ca is not supported; use client_ca_file",
    "client_allowed_sans": "client_allowed_sans is not supported (Python's ssl module has no hook to check "
    "the client certificate's SANs during the handshake)",
    "cipher_suites": "cipher_suites is not supported (OpenSSL defaults apply)",
    "curve_preferences": "curve_preferences is not supported (OpenSSL defaults apply)",
}


def _check_tls(cfg: WebConfig) -> None:
    """The TLS settings: none unsupported; when on, a certificate and key that load, a client CA where client
    certificates are verified, versions in order."""
    tls = cfg.tls_server_config
    for key, why in _UNSUPPORTED_TLS.items():
        if getattr(tls, key) is not None:
            raise WebConfigError(f"tls_server_config.{key}: {why}")
    if not tls.enabled:
        return
    for key in ("cert_file", "key_file"):
        if getattr(tls, key) is None:
            raise WebConfigError(f"tls_server_config: missing {key}")
    if tls.client_auth_type in ("RequireAnyClientCert", "RequireClientCert"):
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {tls.client_auth_type} (a certificate required but never "
            "verified) cannot be served by Python's ssl module; use RequireAndVerifyClientCert with "
            "client_ca_file"
        )
    if tls.client_ca_file is not None and tls.client_auth_type == "NoClientCert":
        raise WebConfigError("tls_server_config: client_ca_file is set but client_auth_type is NoClientCert")
    if tls.cert_reqs != ssl.CERT_NONE and tls.client_ca_file is None:
        raise WebConfigError(f"tls_server_config: client_auth_type {tls.client_auth_type} needs client_ca_file")
    if _TLS_VERSIONS[tls.min_version] > _TLS_VERSIONS[tls.max_version]:
        raise WebConfigError("tls_server_config: min_version is above max_version")
    cfg.server_context()  # loads cert, key and client CA: unreadable or mismatched files fail here


def _check_user(user: str, hashed: str | None) -> None:
    """A basic-auth user: a name HTTP can carry, a bcrypt hash of a cost from 4 to MAX_BCRYPT_COST."""
    if ":" in user:
        raise WebConfigError(f"basic_auth_users: user {user!r} contains ':', which HTTP basic auth cannot carry")
    match = BCRYPT_HASH.match(hashed or "")
    if match and int(match.group(1)) > MAX_BCRYPT_COST:
        raise WebConfigError(
            f"basic_auth_users: the hash of {user!r} has bcrypt cost {int(match.group(1))}, above the "
            f"{MAX_BCRYPT_COST} accepted (a login would outlast a scrape); hash it again with a lower cost"
        )
    if not match or not 4 <= int(match.group(1)) <= 31:
        # Never echo the value: a plain-text password in this field is a secret.
        raise WebConfigError(
            f"basic_auth_users: the password of {user!r} is not a bcrypt hash ($2b$<cost>$...); "
            "hash it with: python3 -c 'import bcrypt,getpass; "
            "print(bcrypt.hashpw(getpass.getpass().encode(), bcrypt.gensalt()).decode())'"
        )


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and validate the web config file at ``path``; return the WebConfig.

    Relative file names inside are resolved against the file's directory (as exporter-toolkit does); an
    empty file is a valid config with TLS and auth off. Raises WebConfigError (one line naming ``path``) for
    a missing or unreadable file, bad YAML, an unknown key or bad value, an unsupported setting, certificate
    files that do not load, and a ``basic_auth_users`` value that is not a bcrypt hash.
    """
    path = Path(path)
    try:
        data = read_yaml(path)  # the same reader, and the same one-line errors, as the main configuration
    except ConfigError as exc:
        raise WebConfigError(f"web config {exc}") from exc
    # Resolve relative file names against the file's directory before validation loads them.
    tls = data.get("tls_server_config")
    if isinstance(tls, dict):
        tls = dict(tls)
        for key in ("cert_file", "key_file", "client_ca_file"):
            value = tls.get(key)
            if isinstance(value, str) and value:
                tls[key] = str(path.parent / Path(value).expanduser())
            elif value == "":
                tls[key] = None  # Go's zero value: the same as absent
        data = {**data, "tls_server_config": tls}
    try:
        cfg = WebConfig.model_validate(data)
    except ValidationError as exc:
        raise WebConfigError(f"web config {path}: {_format_validation(exc)}") from None
    try:
        _check(cfg)
    except WebConfigError as exc:
        raise WebConfigError(f"web config {path}: {exc}") from exc.__cause__
    if cfg.basic_auth_users and not cfg.tls_enabled:
        log.warning("web config %s: basic_auth_users without tls_server_config sends passwords in clear text", path)
    return cfg
