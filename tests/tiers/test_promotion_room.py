"""Promotion on hit into a full memory (docs/parts/tiers.md, "When data moves down and up"):
a re-read hot set of disk-only objects comes back to memory within seconds although memory is
full of colder objects (on-evict reclaim moves them to disk to make the room), and nothing is
lost on the way. `kvpool bench tiers` times it (`promotion_seconds`)."""

from __future__ import annotations

import time
from pathlib import Path

from kvpool.client import Store
from kvpool.protocol.messages import ReplicaKind
from kvtest.disk import add_disk_node, offload_pool
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.replicas import kinds
from kvtest.stores import open_store
from kvtest.values import pattern

HOT = 8


def value(i: int) -> bytes:
    return pattern(i, b"promoted")


def test_a_hot_set_comes_back_into_a_full_memory_by_displacing_cold_objects(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    # Leases far longer than the test: room that came only from leases running out would
    # come too late.
    p = offload_pool(
        pool, "on-evict", "--promotion-admission-threshold", "2", "--default-kv-lease-ttl", "30"
    )
    add_disk_node(p, "32MiB", tmp_path / "disk", "256MiB")
    s = open_store(stores, p.address, rpc_timeout=30.0)
    keys = [f"k{i}" for i in range(96)]  # 3x the memory
    for i, k in enumerate(keys):
        assert s.put(k, value(i))
    # The oldest objects are on disk only. Only they are asked about: a GetReplicaList
    # leases what it names, and a leased object is not evicted to make room (until its lease
    # runs out, here after 30 s).
    hot = keys[:HOT]
    assert all(set(kinds(s, k)) == {ReplicaKind.LOCAL_DISK} for k in hot)
    deadline = time.monotonic() + 10  # a third of the lease
    while not all(ReplicaKind.MEMORY in kinds(s, k) for k in hot):
        assert time.monotonic() < deadline, [sorted(kinds(s, k)) for k in hot]
        for k in hot:
            assert s.get(k) == value(keys.index(k))
    for k in hot:
        assert s.get(k) == value(keys.index(k))  # exact from memory
        assert ReplicaKind.LOCAL_DISK in kinds(s, k)  # the disk copy stays
    # Nothing was lost making the room: every object still reads back exactly.
    for i, k in enumerate(keys):
        assert s.get(k) == value(i)
