"""`Store(read_mode="cached")`: reads from remembered places, verified by their checksum.

Against a real pool (a master and one `kvpool node` on loopback). The master is frozen
(SIGSTOP) to show that a remembered read does not ask it; a key removed and its range taken
by another value of the same size shows that a stale place never returns wrong bytes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest

from kvpool.client import Store
from kvpool.client.config import StoreConfig
from kvpool.client.locations import Locations
from kvpool.errors import ErrorCode, InvalidParams, ObjectNotFound, RpcError
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.procs import freeze, wait_until


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="32MiB")


@pytest.fixture
def cached(one_node: Pool) -> Iterator[Store]:
    with Store(one_node.address, read_mode="cached", location_ttl=30.0) as s:
        try:
            yield s
        finally:
            s.remove_all(force=True)


def _value(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _place(store: Store, key: str) -> tuple[str, int]:
    (desc,) = store.get_replica_desc(key)
    return str(desc.segment), desc.offset


def test_read_mode_is_validated() -> None:
    with pytest.raises(InvalidParams, match="read_mode"):
        StoreConfig(read_mode="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidParams, match="location_ttl"):
        StoreConfig(read_mode="cached", location_ttl=0)
    with pytest.raises(InvalidParams, match="location_capacity"):
        StoreConfig(location_capacity=0)


@pytest.mark.parametrize("size", [4096, 1 << 20])
def test_a_remembered_get_does_not_ask_the_master(one_node: Pool, size: int) -> None:
    with (
        Store(one_node.address, read_mode="cached", rpc_timeout=1.0) as s,
        Store(one_node.address, read_mode="cached", protocol="tcp", rpc_timeout=1.0) as t,
    ):
        value = _value(size, size)
        assert s.put("frozen-a", value) is True  # remembered by the put
        assert t.put("frozen-b", value) is True
        buf = bytearray(size)
        s.register_buffer(buf)
        pid = one_node.master.pid
        freeze(pid)
        try:
            assert s.get("frozen-a") == value  # shared memory, no master
            assert t.get("frozen-b") == value  # TCP to the node, no master
            assert s.get_into("frozen-a", buf) == size and buf == value
            assert s.exists("frozen-a") is True
            assert s.batch_get(["frozen-a"]) == [value]
            with pytest.raises(RpcError):  # not remembered: it must ask, and cannot
                s.get("frozen-b")
        finally:
            os.kill(pid, signal.SIGCONT)
        s.unregister_buffer(buf)
        s.remove_all(force=True)


def test_strict_mode_remembers_nothing(one_node: Pool) -> None:
    with Store(one_node.address) as s:
        assert s.config.read_mode == "strict"
        s.put("strict", b"x" * 100)
        assert s._locations is None
        assert s.get("strict") == b"x" * 100
        s.remove_all(force=True)


def test_a_reused_range_fails_the_checksum_and_the_read_asks_the_master(
    one_node: Pool, cached: Store
) -> None:
    """The torn-read case: the key is removed behind the reader's back and its range now holds
    another value of the same size. The remembered read copies those bytes, the checksum does
    not match, the entry is forgotten and the master answers: the key is gone."""
    size = 64 << 10
    old, new = _value(1, size), _value(2, size)
    # arena_size=0: puts take PutStart, so a freed range is handed out again by the allocator.
    with Store(one_node.address, arena_size=0) as other:
        assert other.put("victim", old) is True
        assert cached.get("victim") == old  # the strict path remembers where it read
        where = _place(cached, "victim")
        other.remove("victim", force=True)
        taken = None
        for i in range(32):  # bounded: the allocator hands the freed range out again
            key = f"reuse{i}"
            assert other.put(key, new) is True
            if _place(other, key) == where:
                taken = key
                break
        assert taken is not None, "the freed range was never reused"
        assert len(cached._locations or ()) >= 1
        with pytest.raises(ObjectNotFound):
            cached.get("victim")
        assert cached._locations is not None and cached._locations.lookup("victim") is None
        assert cached.batch_get_ex(["victim", taken]) == [ErrorCode.OBJECT_NOT_FOUND, new]
        other.remove_all(force=True)


def test_without_the_stream_a_removed_value_may_be_read_until_the_ttl_then_not(
    one_node: Pool,
) -> None:
    """The documented bound when no invalidation arrives (a master that does not push, a
    lost stream): removed by another client, the old bytes (still in place, checksum intact)
    may be returned for at most `location_ttl`; after it, the master says the key is gone."""
    with (
        Store(one_node.address, read_mode="cached", location_ttl=0.5) as s,
        Store(one_node.address) as other,
    ):
        s._node.rpc.on_push = None  # the pushes are not heard
        assert s._locations is not None
        s._locations.refresh = None
        value = _value(3, 4096)
        assert s.put("stale", value) is True
        other.remove("stale", force=True)
        assert s.get("stale") == value  # within the TTL: the remembered bytes
        wait_until(lambda: not s.exists("stale"), timeout=10, what="the entry to expire")
        with pytest.raises(ObjectNotFound):
            s.get("stale")
        s.remove_all(force=True)


def test_own_remove_and_upsert_are_seen_at_once(cached: Store) -> None:
    cached.put("mine", b"a" * 64)
    cached.remove("mine")
    with pytest.raises(ObjectNotFound):
        cached.get("mine")
    assert cached.exists("mine") is False
    cached.put("up", b"b" * 64)
    cached.upsert("up", b"c" * 64)
    assert cached.get("up") == b"c" * 64
    cached.batch_put(["r1", "r2"], [b"d" * 8, b"e" * 8])
    assert cached.batch_remove(["r1", "r2"]) == [ErrorCode.OK, ErrorCode.OK]
    assert cached.batch_exists(["r1", "r2"]) == [False, False]


def test_a_batch_mixes_remembered_asked_and_missing_keys(one_node: Pool, cached: Store) -> None:
    keys = [f"b{i}" for i in range(8)]
    values = [_value(10 + i, 4096 + i) for i in range(8)]
    with Store(one_node.address) as other:
        assert other.batch_put(keys[4:], values[4:]) == [ErrorCode.OK] * 4
        assert cached.batch_put(keys[:4], values[:4]) == [ErrorCode.OK] * 4  # remembered
        asked = [*keys, "nope"]
        assert cached.batch_get(asked) == [*values, None]
        assert cached.batch_get_ex(asked) == [*values, ErrorCode.OBJECT_NOT_FOUND]
        assert cached.batch_exists(asked) == [True] * 8 + [False]
        bufs = [bytearray(8192) for _ in asked]
        for b in bufs:
            cached.register_buffer(b)
        try:
            got = cached.batch_get_into(asked, bufs)
            assert got[:8] == [len(v) for v in values]
            assert got[8] == int(ErrorCode.OBJECT_NOT_FOUND)
            assert all(bytes(b[: len(v)]) == v for b, v in zip(bufs, values, strict=False))
        finally:
            for b in bufs:
                cached.unregister_buffer(b)
        other.remove_all(force=True)


def test_locations_are_a_bounded_lru_with_a_ttl() -> None:
    now = [0.0]
    locs = Locations(ttl=1.0, capacity=2, clock=lambda: now[0])
    locs.remember("a", "s", 0, 1, 11)
    locs.remember("b", "s", 8, 1, 12)
    assert locs.lookup("a") is not None  # a is now the most recent
    locs.remember("c", "s", 16, 1, 13)  # evicts b
    assert locs.lookup("b") is None
    assert [e is not None for e in locs.lookup_many(["a", "c"])] == [True, True]
    now[0] = 1.5
    assert locs.lookup("a") is None and len(locs) == 1


def _gone(store: Store, key: str) -> bool:
    try:
        store.get(key)
    except ObjectNotFound:
        return True
    return False


@pytest.mark.parametrize("how", ["remove", "upsert same size", "upsert other size"])
def test_the_stream_makes_another_clients_change_visible_long_before_the_ttl(
    one_node: Pool, how: str
) -> None:
    with (
        Store(one_node.address, read_mode="cached", location_ttl=60.0) as s,
        Store(one_node.address) as other,
    ):
        old = _value(4, 4096)
        assert other.put("changing", old) is True
        assert s.get("changing") == old  # remembered
        if how == "remove":
            other.remove("changing", force=True)
            wait_until(lambda: _gone(s, "changing"), timeout=5, what="the removal to be seen")
        else:
            new = _value(5, 4096 if how == "upsert same size" else 8192)
            other.upsert("changing", new)
            wait_until(lambda: s.get("changing") == new, timeout=5, what="the new value")
        assert s._invalidations is not None and s._invalidations.pushes >= 1
        other.remove_all(force=True)


def test_a_new_connection_forgets_everything_and_subscribes_again(one_node: Pool) -> None:
    with Store(one_node.address, read_mode="cached", location_ttl=60.0) as s:
        assert s.put("kept", b"k" * 100) is True
        assert s._locations is not None and len(s._locations) == 1
        s._node.rpc.reconnect()  # the stream of the old connection is gone
        s.exists("other")  # any call connects again
        assert len(s._locations) == 0
        assert s.get("kept") == b"k" * 100  # from the master again
        assert s._invalidations is not None
        assert s._invalidations._conn is s._node.rpc.current_connection()
        s.remove_all(force=True)
