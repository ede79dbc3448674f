"""The disk tier in a real pool: a master and `kvpool node --offload-dir` processes on loopback,
real files under tmp_path (docs/parts/tiers.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.client.disk import DATA_FILE
from kvpool.errors import KVPoolError
from kvpool.protocol.messages import ReplicaKind
from kvtest.disk import add_disk_node, offload_pool
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.replicas import kinds
from kvtest.stores import open_store
from kvtest.values import MiB, pattern


def value(i: int, size: int = MiB) -> bytes:
    return pattern(i, b"kvpool-t", size)


def test_512mib_through_64mib_of_memory_reads_back_exactly_and_hot_keys_return_to_memory(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "on-evict")
    add_disk_node(p, "64MiB", tmp_path / "disk", "1GiB")
    s = open_store(stores, p.address, rpc_timeout=30.0)
    n = 512
    for i in range(n):
        assert s.put(f"obj{i}", value(i))
    for i in range(n):
        assert s.get(f"obj{i}") == value(i), f"obj{i}"
    assert ReplicaKind.LOCAL_DISK in kinds(s, "obj0")
    # Promotion on hit: re-reading a disk-only hot set brings it back to memory.
    hot = [f"obj{i}" for i in range(4)]

    def promoted() -> bool:
        for k in hot:
            s.get(k)
        return all(ReplicaKind.MEMORY in kinds(s, k) for k in hot)

    wait_until(promoted, timeout=20, interval=0.2, what="the hot set to be promoted")
    assert ReplicaKind.MEMORY not in kinds(s, f"obj{n // 2}")  # a cold one stays on disk


def test_a_restarted_node_serves_its_disk_again_and_refuses_a_corrupted_object(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "on-evict")
    disk = tmp_path / "disk"
    add_disk_node(p, "16MiB", disk, "256MiB")
    s = open_store(stores, p.address, rpc_timeout=30.0)
    n = 48
    for i in range(n):
        assert s.put(f"r{i}", value(i))
    on_disk = [i for i in range(n) if ReplicaKind.LOCAL_DISK in kinds(s, f"r{i}")]
    assert len(on_disk) >= n // 2
    victim = on_disk[0]
    (desc,) = [r for r in s.get_replica_desc(f"r{victim}") if r.kind == ReplicaKind.LOCAL_DISK]
    assert p.stop_node(0) == 0
    with open(disk / DATA_FILE, "r+b") as f:  # flip one byte while the node is down
        f.seek(desc.offset + 12345)
        byte = f.read(1)
        f.seek(desc.offset + 12345)
        f.write(bytes([byte[0] ^ 0xFF]))
    add_disk_node(p, "16MiB", disk, "256MiB")
    assert "1 refused" in p.nodes[-1].output()
    back = [i for i in on_disk if i != victim]
    wait_until(lambda: all(s.exists(f"r{i}") for i in back), timeout=20, what="disk objects back")
    for i in back:
        assert s.get(f"r{i}") == value(i)
    with pytest.raises(KVPoolError):
        s.get(f"r{victim}")  # refused at the node's open: never served


def test_pool_mode_with_a_disk_tier_loses_nothing_at_4x_memory(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "on-evict", "--eviction-mode", "pool")
    add_disk_node(p, "32MiB", tmp_path / "disk", "512MiB")
    s = open_store(stores, p.address, rpc_timeout=30.0)
    n = 128  # 4x the memory
    for i in range(n):
        assert s.put(f"p{i}", value(i))
    for i in range(n):
        assert s.get(f"p{i}") == value(i), f"p{i}"


def test_kill_9_in_the_middle_of_offloading_never_serves_a_torn_object(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "eager")
    disk = tmp_path / "disk"
    add_disk_node(p, "128MiB", disk, "256MiB")
    s = open_store(stores, p.address, rpc_timeout=30.0)
    n = 96
    for i in range(n):
        assert s.put(f"k{i}", value(i))
    # Kill -9 once some objects are on disk and others are still being offloaded.
    done = wait_until(
        lambda: [i for i in range(n) if ReplicaKind.LOCAL_DISK in kinds(s, f"k{i}")],
        timeout=20,
        interval=0.005,
        what="the first offloads",
    )
    p.kill_node(0)
    add_disk_node(p, "128MiB", disk, "256MiB")
    wait_until(lambda: "verified" in p.nodes[-1].output(), what="the disk tier to open")
    served = 0
    for i in range(n):
        try:
            got = s.get(f"k{i}")
        except KVPoolError:
            continue  # lost with the node's memory: allowed, a torn object is not
        assert got == value(i), f"k{i}"
        served += 1
    # Every object the master was told is on disk was journaled whole: it is served again.
    assert served >= len(done), p.nodes[-1].output()


def test_an_object_removed_does_not_come_back_when_its_node_restarts(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "eager")
    disk = tmp_path / "disk"
    add_disk_node(p, "64MiB", disk, "64MiB")
    s = open_store(stores, p.address, rpc_timeout=30.0)
    for key in ("kept", "removed"):
        assert s.put(key, value(len(key)))
    wait_until(
        lambda: all(ReplicaKind.LOCAL_DISK in kinds(s, k) for k in ("kept", "removed")),
        what="both offloaded",
    )
    s.remove("removed", force=True)
    # The node journals the freed range at its next FetchTasks (every 50 ms).
    wait_until(lambda: _journal_has_del(disk), what="the free to be journaled")
    assert p.stop_node(0) == 0
    add_disk_node(p, "64MiB", disk, "64MiB")
    wait_until(lambda: s.exists("kept"), what="the kept object back")
    assert s.get("kept") == value(4)
    assert not s.exists("removed")


def _journal_has_del(disk: Path) -> bool:
    data = (disk / "kvpool-disk.journal").read_bytes()
    return data.count(b"removed") >= 2  # the ADD and the DEL record both name the key
