"""The uvicorn internals gpuwarden/web/listener.py overrides are still there with the same signatures: each mismatch
is one line naming the method, what the listener expects and what the installed uvicorn has."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpuwarden.web import listener
from gpuwarden.web.limits import HttpLimits

CLASSES = {"Server": uvicorn.Server, "HttpToolsProtocol": HttpToolsProtocol}


def _attr(qualname: str) -> object:
    cls, _, name = qualname.partition(".")
    return getattr(CLASSES[cls], name, None)


def test_every_overridden_method_keeps_its_signature() -> None:
    problems = []
    for qualname, params in listener.CONTRACT.items():
        method = _attr(qualname)
        if method is None:
            problems.append(f"uvicorn {uvicorn.__version__} has no {qualname} (gpuwarden.web.listener overrides it)")
            continue
        have = tuple(inspect.signature(method).parameters)  # type: ignore[arg-type]
        if have != params:
            problems.append(f"uvicorn {uvicorn.__version__}: {qualname}{have}, gpuwarden.web.listener expects {params}")
    assert not problems, "; ".join(problems)


def test_uvicorn_still_makes_the_calls_the_overrides_depend_on() -> None:
    problems = []
    for qualname, calls in listener.CONTRACT_CALLS.items():
        method = _attr(qualname)
        source = inspect.getsource(method) if method is not None else ""  # type: ignore[arg-type]
        problems += [f"uvicorn {uvicorn.__version__}: {qualname} no longer has {c}" for c in calls if c not in source]
    assert not problems, "; ".join(problems)


def test_the_contract_lists_every_method_the_listener_overrides() -> None:
    def overrides(cls: type, base: type, prefix: str) -> set[str]:
        return {f"{prefix}.{n}" for n, v in vars(cls).items() if callable(v) and n in vars(base) and n != "__init__"}

    found = overrides(listener.Server, uvicorn.Server, "Server")
    found |= overrides(listener.bounded_protocol(HttpLimits()), HttpToolsProtocol, "HttpToolsProtocol")
    assert found and found <= set(listener.CONTRACT), found - set(listener.CONTRACT)


def test_pyproject_pins_uvicorn_to_a_range_with_an_upper_bound_that_holds_the_installed_one() -> None:
    text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    match = re.search(r'"uvicorn>=([\d.]+),<([\d.]+)"', text)
    assert match, "pyproject.toml: uvicorn needs an upper bound (gpuwarden/web/listener.py overrides its internals)"
    installed = tuple(int(x) for x in uvicorn.__version__.split(".")[:2])
    low = tuple(int(x) for x in match.group(1).split(".")[:2])
    high = tuple(int(x) for x in match.group(2).split(".")[:2])
    assert low <= installed < high


def test_asyncio_still_sizes_each_tls_read_buffer_by_max_size() -> None:
    """The listener bounds a TLS connection's read buffer by setting asyncio's ``SSLProtocol.max_size``; that only
    works while SSLProtocol allocates its buffer from it."""
    import asyncio.sslproto

    assert isinstance(asyncio.sslproto.SSLProtocol.max_size, int)
    assert "bytearray(self.max_size)" in inspect.getsource(asyncio.sslproto.SSLProtocol.__init__)
