"""A poll that takes more than half the poll interval is logged (once per SLOW_POLL_LOG_SECONDS, with a count)."""

from __future__ import annotations

import logging
import time

import pytest
from conftest import trace

from gpuwarden.model import PollResult
from gpuwarden.poller import Poller
from gpuwarden.replay import ReplaySource


class SlowReplay(ReplaySource):
    """A replay whose polls take ``delay`` seconds."""

    delay = 0.0

    def poll(self) -> PollResult:
        time.sleep(self.delay)
        return super().poll()


def test_a_poll_over_half_the_interval_is_logged_once_with_the_count(caplog: pytest.LogCaptureFixture) -> None:
    source = SlowReplay(trace("h100-idle"))
    # a fast poll against an interval no loaded machine's replay poll comes near half of (its own thread's next poll
    # is that far away too); then the interval a 60 ms poll is over half of
    poller = Poller(source, interval=10.0)
    poller.start(ready=False)
    try:
        caplog.set_level(logging.WARNING, logger="gpuwarden.poller")
        poller.poll_once()  # fast: no warning
        assert "half the poll interval" not in caplog.text
        poller.interval = 0.1
        source.delay = 0.06
        poller.poll_once()
        poller.poll_once()
        lines = [r.getMessage() for r in caplog.records if "half the poll interval" in r.getMessage()]
        assert len(lines) == 1 and "1 slow since the last warning" in lines[0], lines
    finally:
        poller.stop()
