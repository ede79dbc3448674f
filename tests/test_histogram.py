"""The latency histograms of the master and of the Store share one ladder of buckets
(`kvpool.histogram`), and a scrape turns per-bucket counts into Prometheus's cumulative form."""

from __future__ import annotations

from bisect import bisect_left

from kvpool import histogram
from kvpool.client import metrics as store_metrics
from kvpool.ops import metrics as master_metrics


def test_the_master_and_the_store_count_on_one_ladder() -> None:
    assert master_metrics.LATENCY_BUCKETS is histogram.LATENCY_BUCKETS
    # The Store's calls may wait on the network: the same ladder, then 5 s.
    assert (*histogram.LATENCY_BUCKETS, 5.0) == store_metrics.LATENCY_BUCKETS
    assert list(histogram.LATENCY_BUCKETS) == sorted(set(histogram.LATENCY_BUCKETS))


def test_cumulative_buckets_end_in_inf_with_every_event() -> None:
    bounds = (0.001, 0.01, 1.0)
    counts = [0] * (len(bounds) + 1)
    for seconds in (0.0005, 0.001, 0.002, 0.5, 3.0, 7.0):
        counts[bisect_left(bounds, seconds)] += 1
    assert histogram.cumulative(bounds, counts) == [
        ("0.001", 2.0),
        ("0.01", 3.0),
        ("1.0", 4.0),
        ("+Inf", 6.0),
    ]
