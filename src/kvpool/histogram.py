"""Latency histograms kept as plain counts and read at scrape time: the bucket bounds the
master's and the Store's metrics share, and their Prometheus form.

`kvpool.ops.metrics` (the master's handler latency) and `kvpool.client.metrics` (the Store's
calls) count into ``len(bounds) + 1`` ints, the slot ``bisect_left(bounds, seconds)``; a scrape
turns them into Prometheus's cumulative buckets with `cumulative`. One ladder for both, so a
dashboard can set the two side by side.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["LATENCY_BUCKETS", "cumulative"]

#: Upper bounds (seconds) of a latency histogram's buckets: 10 us to 1 s.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.05,
    0.25,
    1.0,
)


def cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """``(le, count)`` pairs for a ``HistogramMetricFamily``: `counts` holds one more slot than
    `bounds` (the +Inf bucket), each the events of its own bucket alone."""
    acc = 0
    out: list[tuple[str, float]] = []
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        acc += count
        out.append(("+Inf" if bound == float("inf") else repr(bound), float(acc)))
    return out
