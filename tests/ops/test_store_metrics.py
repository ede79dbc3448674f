"""Store-side counters (`Store(..., metrics=True)`, `kvpool.client.metrics`): exact counts after
a known workload against a live pool, the path of each read (shared memory on this host, TCP
when forced), the Prometheus export, and a Store without metrics left exactly as it was."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from kvpool import Store
from kvpool.client.metrics import MeteredReader, MeteredWriter, register_store_metrics
from kvpool.client.reader import Reader
from kvpool.client.writer import Writer
from kvpool.errors import InvalidParams, ObjectNotFound
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401


@pytest.fixture(scope="module")
def live(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="16MiB")


def test_counts_are_exact_after_a_known_workload(live: Pool) -> None:
    with Store(live.address, metrics=True) as store:
        m = store.metrics
        assert m is not None
        for i in range(10):
            assert store.put(f"mx-{i}", bytes([i]) * 1000)
        assert not store.put("mx-0", b"again")  # exists: nothing written
        codes = store.batch_put([f"mb-{i}" for i in range(5)], [b"b" * 2000] * 5)
        assert all(c == 0 for c in codes)
        assert (m.puts, m.put_exists, m.put_failures, m.put_bytes) == (15, 1, 0, 20_000)

        for i in range(10):
            assert store.get(f"mx-{i}") == bytes([i]) * 1000
        with pytest.raises(ObjectNotFound):
            store.get("mx-missing")
        buf = bytearray(4096)
        store.register_buffer(buf)
        assert store.get_into("mb-0", buf) == 2000
        got = store.batch_get([*(f"mb-{i}" for i in range(5)), "nope-1", "nope-2"])
        assert [v is not None for v in got] == [True] * 5 + [False] * 2
        b1, b2 = bytearray(1000), bytearray(10)
        store.register_buffer(b1)
        store.register_buffer(b2)
        assert store.batch_get_into(["mx-1", "nope-3"], [b1, b2])[0] == 1000
        assert (m.hits, m.misses, m.errors) == (10 + 1 + 5 + 1, 1 + 2 + 1, 0)
        assert m.get_bytes == 10 * 1000 + 2000 + 5 * 2000 + 1000
        # Paths: the node is on this host, so reads copy through shared memory.
        assert m.calls("get", "shm") == 10 and m.calls("get", "none") == 1
        assert m.calls("get_into", "shm") == 1
        assert m.calls("batch_get", "shm") == 1 and m.calls("batch_get_into", "shm") == 1
        assert m.calls("put") == 11 and m.calls("batch_put") == 1

        registry = CollectorRegistry()
        register_store_metrics(store, registry, name="s1")
        text = generate_latest(registry).decode()
        assert 'kvpool_store_get_hits_total{store="s1"} 17.0' in text
        assert 'kvpool_store_get_misses_total{store="s1"} 4.0' in text
        assert 'kvpool_store_puts_total{store="s1"} 15.0' in text
        assert 'kvpool_store_put_bytes_total{store="s1"} 20000.0' in text
        assert 'kvpool_store_op_seconds_count{op="get",path="shm",store="s1"} 10.0' in text


def test_reads_over_tcp_are_labelled_tcp(live: Pool) -> None:
    with Store(live.address, metrics=True) as writer:
        writer.put("mt-0", b"t" * 5000)
    with Store(live.address, protocol="tcp", metrics=True) as store:
        assert store.get("mt-0") == b"t" * 5000
        assert store.batch_get(["mt-0"]) == [bytearray(b"t" * 5000)]
        m = store.metrics
        assert m is not None
        assert m.calls("get", "tcp") == 1 and m.calls("batch_get", "tcp") == 1
        assert (m.hits, m.get_bytes) == (2, 10_000)


def test_cached_reads_are_labelled_by_the_place_they_read(live: Pool) -> None:
    """`read_mode="cached"` reads skip the master (and `read`): a remembered place keeps its
    path (shm, or tcp from another host), a hot-cache value is `hot`, never `none`."""
    with Store(live.address, metrics=True) as writer:
        writer.put("mc-0", b"c" * 5000)
    with Store(live.address, read_mode="cached", metrics=True) as store:
        for _ in range(3):
            assert store.get("mc-0") == b"c" * 5000
        assert store.batch_get(["mc-0"]) == [bytearray(b"c" * 5000)]
        m = store.metrics
        assert m is not None
        assert m.calls("get", "shm") == 3 and m.calls("get", "none") == 0
        assert m.calls("batch_get", "shm") == 1
    kw = {"read_mode": "cached", "hot_cache_size": "1MiB", "protocol": "tcp"}
    with Store(live.address, metrics=True, **kw) as store:  # type: ignore[arg-type]
        for _ in range(4):  # admitted on the second read, served hot from the third
            assert store.get("mc-0") == b"c" * 5000
        m = store.metrics
        assert m is not None
        assert m.calls("get", "tcp") == 2 and m.calls("get", "hot") == 2
        assert m.calls("get", "none") == 0 and m.hits == 4


def test_a_store_without_metrics_is_unchanged(live: Pool) -> None:
    with Store(live.address) as store:
        assert store.metrics is None
        assert type(store._reader) is Reader and type(store._writer) is Writer
        with pytest.raises(InvalidParams):
            register_store_metrics(store, CollectorRegistry())
    with Store(live.address, metrics=True) as store:
        assert isinstance(store._reader, MeteredReader)
        assert isinstance(store._writer, MeteredWriter)
    with pytest.raises(InvalidParams):
        Store(live.address, metrics="yes")  # type: ignore[arg-type]
