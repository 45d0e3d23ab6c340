"""Credentials in a URL are never printed: diagnose --url and top/report --prometheus show the URL without them."""

from __future__ import annotations

import pytest
from helpers import free_port

from gpuwarden.cluster.promapi import Prometheus, PrometheusError
from gpuwarden.commands.diagnose import url_report
from gpuwarden.source import SourceError
from gpuwarden.terminal import redacted


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://scraper:s3cret@node:10400", "http://scraper:***@node:10400"),
        ("https://u:p%40ss@host/x?y=1", "https://u:***@host/x?y=1"),
        ("http://node:10400", "http://node:10400"),
        ("http://only-user@node", "http://only-user@node"),
        ("not a url", "not a url"),
    ],
)
def test_a_password_in_a_url_is_replaced(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_diagnose_url_errors_do_not_print_the_password() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(SourceError) as err:
        url_report(f"http://scraper:s3cret-pw@127.0.0.1:{port}", timeout=2)
    assert "s3cret-pw" not in str(err.value) and "scraper:***@127.0.0.1" in str(err.value)


def test_prometheus_errors_do_not_print_the_password() -> None:
    port = free_port()
    prom = Prometheus(f"http://admin:hunter2@127.0.0.1:{port}", timeout=2)
    with pytest.raises(PrometheusError) as err:
        prom.query("up")
    assert "hunter2" not in str(err.value) and "admin:***@" in str(err.value)
