"""The failure-injecting proxy: seeded (same seed, same faults), and its faults are the kinds the
controllers must survive: failed stores never reach the store, failed loads come back scribbled."""

from __future__ import annotations

from kvpool.cache.adapters.blocking import BlockingAdapter
from kvpool.cache.adapters.fault import FaultInjectingAdapter
from kvpool.cache.adapters.mock import MockAdapter
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryLayout, MemoryObj

KEYS = [ObjectKey("m", 0, bytes([i])) for i in range(32)]


def objs(fill: int) -> list[MemoryObj]:
    out = []
    for k in KEYS:
        o = MemoryObj(k, MemoryLayout.of_bytes(256))
        o.array[:] = fill
        out.append(o)
    return out


def load_pattern(seed: int) -> tuple[Bitmap, list[bytes]]:
    inner = MockAdapter()
    assert BlockingAdapter(inner).store(KEYS, objs(7)).ok
    with FaultInjectingAdapter(inner, seed=seed, load_failure_rate=0.3) as proxy:
        dest = objs(0)
        got = BlockingAdapter(proxy).load(KEYS, dest)
        return got, [bytes(o.buffer) for o in dest]


def test_same_seed_same_faults_and_failed_buffers_are_scribbled() -> None:
    a, bytes_a = load_pattern(42)
    b, _ = load_pattern(42)
    c, _ = load_pattern(43)
    assert a == b
    assert a != c
    assert 0 < a.popcount() < len(KEYS)
    for i, data in enumerate(bytes_a):
        if a.test(i):
            assert data == bytes([7]) * 256
        else:
            assert data != bytes([7]) * 256  # never looks like the right value by accident


def test_failed_stores_never_reach_the_inner_store() -> None:
    inner = MockAdapter()
    with FaultInjectingAdapter(inner, seed=1, store_failure_rate=1.0, max_delay_s=0.01) as proxy:
        res = BlockingAdapter(proxy).store(KEYS[:4], objs(1)[:4])
        assert not res.ok and "injected" in res.error
        assert inner.stored_keys() == set()
        assert proxy.injected_store_failures == 1


def test_hidden_lookups_release_the_inner_lock() -> None:
    inner = MockAdapter()
    assert BlockingAdapter(inner).store(KEYS, objs(3)).ok
    with FaultInjectingAdapter(inner, seed=9, lookup_miss_rate=0.5) as proxy:
        found = BlockingAdapter(proxy).lookup_and_lock(KEYS)
        assert 0 < found.popcount() < len(KEYS)
        # Exactly the reported keys stay locked in the inner adapter.
        assert set(inner.locked_keys()) == set(found.gather(KEYS))
        proxy.submit_unlock(found.gather(KEYS))
        assert inner.locked_keys() == {}
