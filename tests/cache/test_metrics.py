"""Prometheus metrics of a StorageManager, collected at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from kvpool.cache.adapters.mock import MockAdapter
from kvpool.cache.keys import ObjectKey
from kvpool.cache.manager import StorageManager
from kvpool.cache.memory import MemoryLayout
from kvpool.cache.metrics import register_cache_metrics


def test_scrape_reports_l1_store_and_prefetch_counters() -> None:
    registry = CollectorRegistry()
    sm = StorageManager(adapters=[MockAdapter()])
    try:
        register_cache_metrics(sm, registry, "t")
        keys = [ObjectKey("m", 0, bytes([i])) for i in range(3)]
        sm.store(keys, [b"x" * 100] * 3)
        assert sm.wait_stores(10)
        sm.l1.delete(keys)
        h = sm.submit_prefetch_task(keys, MemoryLayout.of_bytes(100))
        assert sm.wait_prefetch(h, 10) == 3
        text = generate_latest(registry).decode()
        assert 'kvpool_cache_store_keys_total{manager="t"} 3.0' in text
        assert 'kvpool_cache_prefetch_keys_loaded_total{manager="t"} 3.0' in text
        assert 'kvpool_cache_l1_used_bytes{manager="t"} 300.0' in text
        sm.finish_read_prefetched(keys)
    finally:
        sm.close()
    assert "kvpool_cache_" not in generate_latest(registry).decode()  # a closed manager is silent
