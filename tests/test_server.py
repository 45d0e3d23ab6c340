"""HTTP behaviour without a network: readiness goes false when polls stop, scrapes never wait on a poll."""

from __future__ import annotations

import threading
import time

from conftest import replay_poller, trace
from fastapi.testclient import TestClient

from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.exposition import Exposition
from gpuwarden.web.app import create_app, readiness


def app_for(poller, stale_after: float = 5.0):  # noqa: ANN001, ANN201
    exp = Exposition(poller, select_collectors(), CollectOptions())
    return TestClient(create_app(poller, exp, stale_after))


def test_readyz_fails_when_the_last_poll_is_stale() -> None:
    p = replay_poller(trace("h100-idle"), 2)
    snap = p.snapshot
    assert readiness(snap, 5.0, now=snap.last_success_timestamp + 1).ready
    late = readiness(snap, 5.0, now=snap.last_success_timestamp + 60)
    assert not late.ready and "old" in late.reason
    assert not readiness(None, 5.0).ready


def test_scrape_answers_while_a_poll_hangs() -> None:
    p = replay_poller(trace("h100-idle"), 2, timing="wall")
    release = threading.Event()
    real_poll = p.source.poll

    def hanging_poll():  # noqa: ANN202
        release.wait(10)
        return real_poll()

    p.source.poll = hanging_poll  # type: ignore[method-assign]
    t = threading.Thread(target=p.poll_once)
    t.start()
    try:
        client = app_for(p, stale_after=0.5)
        start = time.perf_counter()
        r = client.get("/metrics")
        assert r.status_code == 200 and "gpu_up" in r.text
        assert time.perf_counter() - start < 2
        time.sleep(0.6)
        assert client.get("/readyz").status_code == 503
    finally:
        release.set()
        t.join()


def test_api_gpus_matches_the_schema() -> None:
    p = replay_poller(trace("h200x2-ddp_straggler"), 3)
    client = app_for(p)
    body = client.get("/api/v1/gpus").json()
    assert [g["static"]["index"] for g in body["gpus"]] == [0, 1]
    assert body["gpus"][0]["reading"]["gpm"]["sm_activity"] >= 0
    schema = client.get("/openapi.json").json()
    assert "GpusDocument" in schema["components"]["schemas"]


def test_telemetry_path_moves_the_exposition() -> None:
    p = replay_poller(trace("h100-idle"), 2)
    exp = Exposition(p, select_collectors(), CollectOptions())
    client = TestClient(create_app(p, exp, 5.0, telemetry_path="/custom/metrics"))
    assert client.get("/custom/metrics").status_code == 200 and b"gpu_up" in client.get("/custom/metrics").content
    assert client.get("/metrics").status_code == 404
    assert 'href="custom/metrics"' in client.get("/").text


def test_telemetry_path_is_checked() -> None:
    import pytest

    from gpuwarden.config import ConfigError, load_config

    for bad in ("metrics", "/healthz", "/api/v1/x", "/a b"):
        with pytest.raises(ConfigError, match="telemetry_path"):
            load_config(None, {"telemetry_path": bad})
    assert load_config(None, {"telemetry_path": "/x/metrics"}).telemetry_path == "/x/metrics"


def test_docs_page_loads_nothing_from_elsewhere() -> None:
    """/docs is Swagger UI from local files: every script, style and link of the page is served by the daemon
    itself (so it works with the network unreachable), and /redoc, which only loads from a CDN, is gone."""
    import re

    p = replay_poller(trace("h100-idle"), 2)
    client = TestClient(create_app(p, Exposition(p, select_collectors(), CollectOptions()), 5.0))
    page = client.get("/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", page.text)
    assert urls and not [u for u in urls if re.match(r"(https?:)?//", u)], urls
    for url in urls:
        if url.startswith("data:"):
            continue
        r = client.get("/" + url.lstrip("/"))
        assert r.status_code == 200, url
    assert (
        client.get("/docs/assets/swagger-ui-bundle.js")
        .headers["content-type"]
        .startswith(("application/javascript", "text/javascript"))
    )
    assert client.get("/redoc").status_code == 404


def test_gzip_follows_the_accept_encoding_weights() -> None:
    client = app_for(replay_poller(trace("h100-idle"), 2))
    for header, gz in [
        ("gzip", True),
        ("deflate, gzip;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),
        ("GZIP; Q=0.000", False),
        ("*;q=0.1, gzip;q=0", False),
        ("identity", False),
        ("gzip;q=nan", False),
        ("gzip;q=abc", False),
    ]:
        r = client.get("/metrics", headers={"Accept-Encoding": header})
        assert r.status_code == 200 and "gpu_up" in r.text
        assert (r.headers.get("content-encoding") == "gzip") is gz, header


def test_fastapi_is_imported_only_for_the_api_reference() -> None:
    """Serving /metrics, the JSON routes and the pages leaves FastAPI unimported (its memory is not paid by a daemon
    nobody browses); the first /openapi.json imports it and answers the schema of the same routes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from conftest import replay_poller, trace
from starlette.testclient import TestClient
from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.exposition import Exposition
from gpuwarden.web.app import create_app
p = replay_poller(trace("h100-idle"), 2)
client = TestClient(create_app(p, Exposition(p, select_collectors(), CollectOptions()), 5.0))
codes = [client.get(u).status_code for u in ("/metrics", "/api/v1/gpus", "/", "/healthz", "/readyz")]
before = "fastapi" in sys.modules
schema = client.get("/openapi.json").json()
print(json.dumps({{"codes": codes, "before": before, "after": "fastapi" in sys.modules,
                   "paths": sorted(schema["paths"])}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["codes"] == [200, 200, 200, 200, 200]
    assert got["before"] is False and got["after"] is True
    assert {"/api/v1/gpus", "/healthz", "/readyz"} <= set(got["paths"])
