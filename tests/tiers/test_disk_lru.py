"""The disk tier's own LRU (`kvpool.master.disk_lru`, `TierManager._make_room`): a full disk
tier drops its least recently used objects for new ones, never a hard-pinned one, and never
loses an object in pool mode (a put that would need that is refused at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.client.replicate import ReplicateConfig
from kvpool.errors import NoSpace
from kvpool.protocol.messages import ReplicaKind
from kvtest.disk import offload_pool
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.replicas import kinds_if_stored as kinds
from kvtest.stores import open_store, stores_last_first  # noqa: F401
from kvtest.values import MiB, pattern

_MEMORY, _DISK = ReplicaKind.MEMORY, ReplicaKind.LOCAL_DISK


def value(i: int) -> bytes:
    return pattern(i, b"disk-lru")


def _owner_and_client(
    made: list[Store], address: str, tmp_path: Path, memory: int, disk: int
) -> tuple[Store, Store]:
    owner = open_store(
        made,
        address,
        segment_size=memory,
        offload_dir=str(tmp_path / "disk"),
        offload_size=disk,
        arena_size=0,
    )
    client = open_store(made, address, arena_size=0)
    return owner, client


def test_a_full_disk_tier_drops_its_least_recently_used_objects_and_keeps_a_hot_one(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(
        pool, "on-evict", "--no-promotion-on-hit",
        "--default-kv-lease-ttl", "0s",  # a reader's lease would keep its object
        "--eviction-high-watermark-ratio", "1.0", "--eviction-ratio", "0.01",
    )  # fmt: skip
    # A reclaim pass serving one put moves a few objects at once (and the disk tier drops as
    # many): a disk tier twice the memory keeps the hot object clear of one pass's drops.
    _, s = _owner_and_client(stores, p.address, tmp_path, 4 * MiB, 8 * MiB)
    n = 0
    for _ in range(6):
        assert s.put(f"a{n}", value(n))
        n += 1
    on_disk = wait_until(
        lambda: (d := [i for i in range(n) if kinds(s, f"a{i}") == [_DISK]]) and len(d) >= 2 and d,
        what="two objects on disk",
    )
    # Every read of a disk-only object touches it (`kinds` too): from here on only `exists`.
    hot = on_disk[0]  # read before every put: always the most recently used on disk
    gone: list[int] = []
    while len(gone) < 8 and n < 60:  # each put moves objects to disk; once it is full, the
        assert s.get(f"a{hot}") == value(hot)  # tier drops its least recently used ones
        assert s.put(f"a{n}", value(n))
        n += 1
        gone = [i for i in range(n) if not s.exists(f"a{i}")]
    assert len(gone) >= 8, gone
    assert hot not in gone, (hot, gone)
    assert s.get(f"a{hot}") == value(hot)
    for i in set(range(n)) - set(gone):
        assert s.get(f"a{i}") == value(i), f"a{i}"


def test_hard_pinned_objects_keep_their_disk_replicas_when_the_tier_is_full(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "eager", "--no-promotion-on-hit", "--default-kv-lease-ttl", "0s")
    _, s = _owner_and_client(stores, p.address, tmp_path, 16 * MiB, 4 * MiB)
    pinned = ReplicateConfig(with_hard_pin=True)
    for i in range(2):
        assert s.put(f"p{i}", value(i), pinned)
    for i in range(2):
        assert s.put(f"u{i}", value(i))
    every = [f"p{i}" for i in range(2)] + [f"u{i}" for i in range(2)]
    wait_until(lambda: all(kinds(s, k) == [_MEMORY, _DISK] for k in every), what="eager copies")
    for i in range(2, 6):  # each eager copy now needs an older unpinned copy dropped
        assert s.put(f"u{i}", value(i))
        wait_until(lambda i=i: kinds(s, f"u{i}") == [_MEMORY, _DISK], what=f"u{i} copied")
    assert kinds(s, "p0") == kinds(s, "p1") == [_MEMORY, _DISK]
    for i in range(6):  # an unpinned object only lost its disk copy: memory still has it
        assert s.get(f"u{i}") == value(i)
    for i in range(2):
        assert s.get(f"p{i}") == value(i)


def test_pool_mode_refuses_a_put_rather_than_drop_a_disk_only_object(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "on-evict", "--eviction-mode", "pool", "--no-promotion-on-hit")
    _, s = _owner_and_client(stores, p.address, tmp_path, 4 * MiB, 4 * MiB)
    stored = 0
    with pytest.raises(NoSpace):
        for i in range(32):  # 8 MiB of memory and disk: the put after that fails
            s.put(f"k{i}", value(i))
            stored += 1
    assert 6 <= stored <= 8, stored
    for i in range(stored):  # nothing stored was lost
        assert s.get(f"k{i}") == value(i), f"k{i}"
