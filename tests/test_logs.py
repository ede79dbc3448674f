"""`RateLimitedLog`: one line per kind per interval, with the count of the ones left out."""

from __future__ import annotations

import logging

import pytest

from kvpool.logs import RateLimitedLog


def test_repeated_events_log_one_line_per_interval_with_the_suppressed_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    limited = RateLimitedLog(logging.getLogger("kvpool.test-logs"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="kvpool.test-logs"):
        assert limited.warning("bad", "bad frame from %s", "a")
        for i in range(1714):
            assert not limited.warning("bad", "bad frame from %s", i)
        assert limited.info("other", "another kind is not held back")
        assert limited.suppressed("bad") == 1714
        now[0] += 10.0
        assert limited.warning("bad", "bad frame from %s", "z")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "bad frame from a",
        "another kind is not held back",
        "bad frame from z (1714 more like this in the last 10 s)",
    ]
    assert limited.suppressed("bad") == 0


def test_a_disabled_level_costs_no_bookkeeping() -> None:
    logger = logging.getLogger("kvpool.test-logs-off")
    logger.setLevel(logging.ERROR)
    limited = RateLimitedLog(logger, 10.0)
    assert not limited.info("x", "quiet")
    assert limited.suppressed("x") == 0
