"""Prometheus metrics of a StorageManager, read at scrape time.

A custom collector asks the manager for its counters when Prometheus scrapes, so the hot paths
(L1 calls, controller loops) pay nothing for metrics. Register it on any registry:

    from prometheus_client import REGISTRY, start_http_server
    register_cache_metrics(sm, REGISTRY)   # kvpool_cache_* families
    start_http_server(9400)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from kvpool.cache.manager import StorageManager

__all__ = ["CacheCollector", "register_cache_metrics"]


class CacheCollector(Collector):
    """kvpool_cache_* metrics of one StorageManager (labelled with `instance_name`)."""

    def __init__(self, manager: StorageManager, instance_name: str = "default") -> None:
        self._sm = manager
        self._name = instance_name

    def collect(self) -> Iterator[Any]:
        if self._sm.closed:
            return
        labels = ["manager"]
        value = [self._name]
        usage = self._sm.l1.usage()
        for name, doc, v in (
            ("kvpool_cache_l1_used_bytes", "Bytes of live L1 objects.", usage.used_bytes),
            ("kvpool_cache_l1_capacity_bytes", "L1 capacity.", usage.capacity_bytes),
            (
                "kvpool_cache_l1_recycled_bytes",
                "Memory of dropped objects kept for reuse.",
                usage.recycled_bytes,
            ),
            ("kvpool_cache_l1_objects", "Objects in L1.", usage.objects),
            (
                "kvpool_cache_l1_read_locked_objects",
                "L1 objects with live read locks.",
                usage.read_locked,
            ),
            (
                "kvpool_cache_prefetch_running",
                "Prefetch requests being worked on.",
                self._sm.prefetch_controller.running(),
            ),
            (
                "kvpool_cache_prefetch_queued",
                "Prefetch requests waiting for a slot.",
                self._sm.prefetch_controller.queued(),
            ),
            (
                "kvpool_cache_store_in_flight",
                "Store tasks submitted and not yet complete.",
                self._sm.store_controller.in_flight(),
            ),
        ):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(value, float(v))
            yield g
        st = self._sm.store_stats()
        pf = self._sm.prefetch_stats()
        for name, doc, v in (
            (
                "kvpool_cache_l1_evictions",
                "Objects evicted from L1 (LRU).",
                self._sm.l1.evicted_count,
            ),
            (
                "kvpool_cache_l1_lock_expiries",
                "L1 locks that ran out their TTL.",
                self._sm.l1.expired_count,
            ),
            ("kvpool_cache_store_keys", "Keys stored to L2 (per adapter copy).", st.stored_keys),
            ("kvpool_cache_store_bytes", "Bytes stored to L2.", st.stored_bytes),
            (
                "kvpool_cache_store_failed_tasks",
                "Store tasks that failed (not retried).",
                st.failed_tasks,
            ),
            (
                "kvpool_cache_store_submit_errors",
                "Store submits an adapter refused.",
                st.submit_errors,
            ),
            ("kvpool_cache_prefetch_requests", "Prefetch requests that reached L2.", pf.requests),
            ("kvpool_cache_prefetch_keys_requested", "Keys asked of L2.", pf.keys_requested),
            (
                "kvpool_cache_prefetch_keys_loaded",
                "Keys loaded from L2 into the hit prefix.",
                pf.keys_loaded,
            ),
            (
                "kvpool_cache_prefetch_load_failures",
                "Planned keys that failed to load.",
                pf.load_failures,
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(value, float(v))
            yield c


def register_cache_metrics(
    manager: StorageManager, registry: CollectorRegistry, instance_name: str = "default"
) -> CacheCollector:
    """Register a collector for `manager` on `registry`; unregister it before closing."""
    collector = CacheCollector(manager, instance_name)
    registry.register(collector)
    return collector
