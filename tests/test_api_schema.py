"""schemathesis against the daemon's own OpenAPI schema (/openapi.json), in three states of the source.

Every operation in the schema is called with generated requests; each answer must not be a server error
and must conform to the schema (status code, content type, body). The states: a replay of the real 2x H200
trace (healthy), the same trace through the fake NVML with GPU 1 lost (a reading with ``up`` false), and the
fake NVML waiting for a driver that is not there (no GPU, /readyz 503).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from conftest import trace
from fake_nvml import FakeNvml
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from gpuwarden.config import load_config
from gpuwarden.daemon import Daemon

H200X2 = trace("h200x2-ddp_straggler")


def _daemon(overrides: dict[str, object], polls: int = 4) -> Daemon:
    cfg = load_config(overrides={"listen_address": "127.0.0.1:0", **overrides})
    d = Daemon(cfg)
    d.poller.start(thread=False)
    for _ in range(polls - 1):
        d.poller.poll_once()
    return d


@pytest.fixture(params=["replay", "nvml_gpu_lost", "nvml_waiting_for_driver"])
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    mp = pytest.MonkeyPatch()
    try:
        if request.param == "replay":
            d = _daemon({"replay": H200X2})
        else:
            fake = FakeNvml(H200X2).install(mp)
            if request.param == "nvml_gpu_lost":
                fake.lose(1, from_poll=2)
            else:
                import pynvml

                fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
            d = _daemon({"wait_for_nvml": request.param == "nvml_waiting_for_driver", "processes": {"enabled": True}})
        yield d
        d.poller.stop()
    finally:
        mp.undo()


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture
def api_schema(daemon: Daemon) -> schemathesis.schemas.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", daemon.app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_conforms_to_the_schema(case: schemathesis.Case) -> None:
    # A 503 is the documented answer of /readyz (and /api/v1/gpus before the first poll) while the source is
    # down: for those operations only the generic "no 5xx" check is left out; status code conformance (the
    # 503 must be in the schema) and response schema conformance still apply.
    documented = {str(code) for code in case.operation.definition.raw.get("responses", {})}
    excluded: list[Any] = [not_a_server_error] if "503" in documented else []
    case.call_and_validate(excluded_checks=excluded)


@pytest.mark.e2e
def test_the_schema_lists_the_api(daemon: Daemon) -> None:
    from fastapi.testclient import TestClient

    paths = TestClient(daemon.app).get("/openapi.json").json()["paths"]
    assert {"/healthz", "/readyz", "/api/v1/gpus"} <= set(paths)
