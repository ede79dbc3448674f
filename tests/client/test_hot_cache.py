"""`Store(hot_cache_size=...)`: values of remote replicas kept in this process.

Against a real pool on loopback. The Store forces TCP (`protocol="tcp"`), which is how it meets
a replica on another host; a frozen node (SIGSTOP) shows that a hot value is served here."""

from __future__ import annotations

import os
import signal

import pytest

from kvpool.client import Store
from kvpool.client.config import StoreConfig
from kvpool.client.hotcache import HotCache
from kvpool.errors import InvalidParams, ObjectNotFound
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.procs import freeze, wait_until


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="16MiB")


def test_the_hot_cache_needs_the_cached_read_mode() -> None:
    with pytest.raises(InvalidParams, match="hot_cache_size"):
        StoreConfig(hot_cache_size="1MiB")  # type: ignore[arg-type]
    assert StoreConfig(read_mode="cached", hot_cache_size="1MiB").hot_cache_size == 1 << 20  # type: ignore[arg-type]


def test_a_value_read_twice_from_a_remote_replica_is_served_here(one_node: Pool) -> None:
    with (
        Store(
            one_node.address,
            read_mode="cached",
            protocol="tcp",
            hot_cache_size="1MiB",
            transfer_timeout=2.0,
        ) as s,
        Store(one_node.address) as other,
    ):
        value = os.urandom(10_000)
        assert other.put("hot", value) is True
        assert other.put("cold", value[::-1]) is True
        assert s.get("hot") == value  # strict: seen once
        assert s.get("hot") == value  # remembered place: seen twice, admitted
        hot = s.hot_cache
        assert hot is not None and hot.admitted == 1 and len(hot) == 1
        pid = one_node.nodes[0].pid
        freeze(pid)
        try:
            assert s.get("hot") == value  # the node cannot answer: from the hot cache
            buf = bytearray(len(value))
            s.register_buffer(buf)
            assert s.get_into("hot", buf) == len(value) and buf == value
            s.unregister_buffer(buf)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert hot.hits == 2
        other.remove("hot", force=True)  # pushed: the hot value goes too
        wait_until(lambda: _gone(s, "hot") and len(hot) == 0, timeout=5, what="the push")
        other.remove_all(force=True)


def test_same_host_replicas_are_not_cached(one_node: Pool) -> None:
    with Store(one_node.address, read_mode="cached", hot_cache_size="1MiB") as s:
        assert s.put("local", b"l" * 1000) is True
        for _ in range(3):
            assert s.get("local") == b"l" * 1000
        assert s.hot_cache is not None and s.hot_cache.admitted == 0
        s.remove_all(force=True)


def _gone(store: Store, key: str) -> bool:
    try:
        store.get(key)
    except ObjectNotFound:
        return True
    return False


def test_admission_lru_ttl_and_invalidation_of_the_hot_cache() -> None:
    now = [0.0]
    hot = HotCache(capacity=200, ttl=5.0, clock=lambda: now[0])

    def twice(key: str, n: int) -> None:
        hot.offer(key, b"v" * n, hot.epoch)
        hot.offer(key, b"v" * n, hot.epoch)

    hot.offer("a", b"x" * 40, hot.epoch)
    assert hot.get("a") is None  # read once: not admitted
    hot.offer("a", b"x" * 40, hot.epoch)
    assert hot.get("a") == b"x" * 40
    twice("big", 51)
    assert hot.get("big") is None  # more than a quarter of the cache
    twice("b", 50)
    twice("c", 50)
    hot.offer("d", b"w" * 50, hot.epoch)
    stale = hot.epoch
    hot.forget_many(["c"])
    hot.offer("d", b"w" * 50, stale)  # its read began before an invalidation: not admitted
    assert hot.get("d") is None and hot.get("c") is None
    twice("d", 50)
    twice("e", 50)
    assert hot.nbytes == 190
    twice("f", 50)  # over 200: the least recently used ("a") goes
    assert hot.get("a") is None and hot.nbytes == 200
    now[0] = 6.0
    assert hot.get("b") is None  # past the TTL
    assert 0 < hot.hit_ratio < 1
