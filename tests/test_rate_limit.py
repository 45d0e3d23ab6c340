"""The web config's ``rate_limit`` with the exporter-toolkit's meaning: one token bucket (golang.org/x/time/rate) for
every request, a refused one answered 429 before authentication; the toolkit's own checks (the burst spent by the
first request; removing ``rate_limit`` lifts the limit; putting it back starts a fresh burst; an unchanged
configuration keeps its bucket) held on a real daemon reloaded from its files, and the bucket's refill against a
clock of the test's."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import trace
from test_webconfig import serve, write_config

from gpuwarden.config import load_config
from gpuwarden.daemon import Daemon
from gpuwarden.web.config import WebConfigError, load_web_config
from gpuwarden.web.gate import AuthGate, TokenBucket

LIMITED = "rate_limit:\n  interval: 1h\n  burst: 1\n"  # one request, then none for an hour
UNLIMITED = "http_server_config:\n  http2: true\n"


def test_the_bucket_starts_full_and_refills_one_token_an_interval_up_to_its_burst() -> None:
    now = [100.0]
    bucket = TokenBucket(1.0, 2, clock=lambda: now[0])
    assert [bucket.allow() for _ in range(3)] == [True, True, False]
    now[0] += 0.5
    assert bucket.allow() is False  # half a token
    now[0] += 0.5
    assert [bucket.allow(), bucket.allow()] == [True, False]
    now[0] += 3600  # an hour idle fills it to its burst, no further
    assert [bucket.allow() for _ in range(3)] == [True, True, False]


def test_an_unchanged_limit_keeps_its_bucket_and_none_turns_it_off() -> None:
    gate = AuthGate(app=lambda *a: None)  # type: ignore[arg-type]
    gate.set_rate_limit(1.0, 1)
    first = gate._bucket
    gate.set_rate_limit(1.0, 1)
    assert first is not None and gate._bucket is first  # a reload hands out no fresh burst
    gate.set_rate_limit(0.0, 1)
    assert gate._bucket is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rate_limit:\n  interval: 1s\n  burst: 0\n", "burst 0 with an interval refuses every request"),
        ("rate_limit:\n  interval: 1s\n", "burst 0 with an interval refuses every request"),
        ("rate_limit:\n  interval: 1d\n  burst: 5\n", "d is not a unit of Go's durations"),
        ("rate_limit:\n  interval: soon\n  burst: 5\n", "'soon' is not a duration"),
        ("rate_limit:\n  interval: 5\n  burst: 5\n", "a bare number is not a duration"),
        ("rate_limit:\n  interval: -1s\n  burst: 5\n", "is negative"),
        ("rate_limit:\n  interval: 1s\n  burst: -1\n", "rate_limit.burst"),
        ("rate_limit:\n  interval: 1s\n  burst: 5\n  per_client: true\n", "rate_limit.per_client: unknown key"),
    ],
)
def test_a_bad_rate_limit_is_one_line_naming_it(tmp_path: Path, text: str, expected: str) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(WebConfigError) as exc:
        load_web_config(path)
    assert expected in str(exc.value) and "\n" not in str(exc.value) and str(path) in str(exc.value)


def test_go_durations_and_an_off_limit_are_read(tmp_path: Path) -> None:
    read = load_web_config(write_config(tmp_path, "rate_limit:\n  interval: 1m30.5s\n  burst: 3\n")).rate_limit
    assert (read.interval_seconds, read.burst) == (90.5, 3)
    assert load_web_config(write_config(tmp_path, "rate_limit:\n  interval: 0\n")).rate_limit.interval_seconds == 0
    assert load_web_config(write_config(tmp_path, "{}\n")).rate_limit.interval_seconds == 0


def test_the_toolkits_checks_on_a_real_daemon_reloaded_from_its_files(tmp_path: Path) -> None:
    web_file = write_config(tmp_path, LIMITED, "web.yml")
    settings = {"listen_address": "127.0.0.1:0", "replay": str(trace("h200x2-ddp_straggler")),
                "web_config_file": str(web_file)}  # fmt: skip
    daemon = Daemon(load_config(overrides=settings), reload=lambda: load_config(overrides=settings))
    daemon.start()
    try:
        with serve(load_web_config(web_file), app=daemon.gate) as url, httpx.Client(timeout=10) as c:

            def status() -> int:
                return c.get(url + "/metrics").status_code

            assert [status(), status()] == [200, 429]  # the burst is spent by the first request
            answer = c.get(url + "/healthz")
            assert answer.status_code == 429 and answer.text == "Too Many Requests\n"  # every path counts
            web_file.write_text(UNLIMITED)
            assert daemon.reload()
            assert [status(), status()] == [200, 200]  # removing rate_limit lifts the limit
            web_file.write_text(LIMITED)
            assert daemon.reload()
            assert [status(), status()] == [200, 429]  # putting it back applies it again, with a fresh burst
            assert daemon.reload()  # the same file again: the same bucket, no fresh burst
            assert status() == 429
    finally:
        daemon.poller.stop()
