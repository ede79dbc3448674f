"""The disk tier's background check (`DiskTier.check`, run by a node every second): an object
whose bytes were corrupted on disk, or every object of a data file deleted under the running
node, is reported and its disk replica dropped, while the object stays readable from memory."""

from __future__ import annotations

import os
from pathlib import Path

from kvpool.client import Store
from kvpool.client.disk import DATA_FILE
from kvpool.protocol.messages import ReplicaKind
from kvtest.disk import add_disk_node, offload_pool, spoil_disk_copy, wait_offloaded
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.replicas import kinds
from kvtest.stores import open_store
from kvtest.values import pattern

MEM, DISK = ReplicaKind.MEMORY, ReplicaKind.LOCAL_DISK


def value(i: int) -> bytes:
    return pattern(i, b"disk-chk")


def test_corrupt_or_vanished_disk_objects_are_dropped_and_read_from_memory(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "eager", "--no-promotion-on-hit")
    disk = tmp_path / "disk"
    add_disk_node(p, "16MiB", disk, "16MiB")
    s = open_store(stores, p.address)
    n = 4
    for i in range(n):
        assert s.put(f"k{i}", value(i))
    wait_offloaded(s, [f"k{i}" for i in range(n)])
    # Corrupt k0's bytes in the file (the node is running; its mapping sees the change).
    spoil_disk_copy(s, "k0", disk)
    wait_until(lambda: kinds(s, "k0") == [MEM], timeout=20, what="k0's corrupt disk copy gone")
    assert s.get("k0") == value(0)
    assert all(kinds(s, f"k{i}") == [MEM, DISK] for i in range(1, n))  # the others are good
    # The data file deleted under the node: nothing of it would survive a restart.
    os.unlink(disk / DATA_FILE)
    wait_until(
        lambda: all(kinds(s, f"k{i}") == [MEM] for i in range(n)),
        timeout=20,
        what="the lost file's disk copies dropped",
    )
    for i in range(n):
        assert s.get(f"k{i}") == value(i)
