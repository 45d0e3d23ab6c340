"""Reloads run one at a time and the latest wins (a SIGHUP storm runs each reload in its own thread)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from conftest import trace

from gpuwarden.config import Config, load_config
from gpuwarden.daemon import Daemon


def test_a_reload_storm_runs_one_reload_at_a_time_and_applies_the_last_request() -> None:
    base = {"listen_address": "127.0.0.1:0", "replay": str(trace("h200x2-ddp_straggler"))}
    asked = [0]  # reload requests made so far: the config a reload reads carries the count at its read
    running = [0]
    most = [0]
    reads = [0]
    guard = threading.Lock()

    def read() -> Config:
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
            reads[0] += 1
            seen = asked[0]
        time.sleep(0.005)  # a reload takes a while: others arrive meanwhile
        with guard:
            running[0] -= 1
        return load_config(overrides={**base, "poll_interval_seconds": 1.0 + seen})

    daemon = Daemon(load_config(overrides=base), reload=read)
    start = threading.Barrier(20)

    def hup() -> None:
        start.wait()
        with guard:
            asked[0] += 1
        daemon.reload()

    threads = [threading.Thread(target=hup) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert 1 <= reads[0] < 20  # folded: requests that came during a reload share the next one
    assert daemon.poller.interval == 1.0 + 20  # the reload after the last request read it
    assert daemon.poller.reload_successful


def test_reload_returns_whether_this_call_applied_a_configuration() -> None:
    base = {"listen_address": "127.0.0.1:0", "replay": str(trace("h200x2-ddp_straggler"))}
    daemon = Daemon(load_config(overrides=base), reload=lambda: load_config(overrides=base))
    assert daemon.reload() is True
    assert Daemon(load_config(overrides=base)).reload() is False  # no reload source


def test_a_certificate_that_fails_to_load_mid_reload_refuses_the_whole_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The certificate pair rotated on disk is read last in a reload; caught half written there (after the web config
    was checked), it raised out of the reload with the new poll interval, collectors and log level already applied and
    the users not. It is read before anything applies: the reload is refused whole, in one line."""
    from gpuwarden.web.config import WebConfig, WebConfigError

    web = tmp_path / "web.yml"
    web.write_text("")
    base = {"listen_address": "127.0.0.1:0", "replay": str(trace("h200x2-ddp_straggler")), "web_config_file": str(web)}
    daemon = Daemon(
        load_config(overrides=base), reload=lambda: load_config(overrides={**base, "poll_interval_seconds": 7.0})
    )

    def half_written(self: WebConfig) -> int:
        raise WebConfigError("key_file: the key does not match the certificate")

    monkeypatch.setattr(WebConfig, "reload_certificates", half_written)
    before = daemon.poller.interval
    with caplog.at_level(logging.ERROR):
        assert daemon.reload() is False
    assert daemon.poller.interval == before and daemon.cfg.poll_interval_seconds != 7.0
    assert daemon.poller.reload_successful is False
    assert [r.getMessage() for r in caplog.records if "reload refused" in r.getMessage()] == [
        "reload refused, keeping the running configuration: key_file: the key does not match the certificate"
    ]
