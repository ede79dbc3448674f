"""The disk tier's background check (`DiskTier.check`, run by a node every second): an object
whose bytes were corrupted on disk, or every object of a data file deleted under the running
node, is reported and its disk replica dropped, while the object stays readable from memory."""

from __future__ import annotations

import os
from pathlib import Path

from kvpool.client import Store
from kvpool.client.disk import DATA_FILE
from kvpool.protocol.messages import ReplicaKind
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until

MiB = 1 << 20
MEM, DISK = ReplicaKind.MEMORY, ReplicaKind.LOCAL_DISK
OFFSET_MASK = (1 << 44) - 1  # a replica id is the segment number << 44 | the offset


def value(i: int) -> bytes:
    return (i.to_bytes(8, "little") + b"disk-chk") * (MiB // 16)


def kinds(s: Store, key: str) -> list[ReplicaKind]:
    return sorted(ReplicaKind(r.kind) for r in s.get_replica_desc(key))


def test_corrupt_or_vanished_disk_objects_are_dropped_and_read_from_memory(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = pool(nodes=0, master_args=("--offload-policy", "eager", "--no-promotion-on-hit"))
    disk = tmp_path / "disk"
    p.add_node("16MiB", "--offload-dir", str(disk), "--offload-size", "16MiB")
    s = Store(p.address, rpc_timeout=20.0)
    stores.append(s)
    n = 4
    for i in range(n):
        assert s.put(f"k{i}", value(i))
    wait_until(
        lambda: all(kinds(s, f"k{i}") == [MEM, DISK] for i in range(n)),
        timeout=20,
        what="every object offloaded",
    )
    # Corrupt k0's bytes in the file (the node is running; its mapping sees the change).
    r = next(r for r in s.get_replica_desc("k0") if r.kind == DISK)
    fd = os.open(disk / DATA_FILE, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xff" * 4096, (r.replica_id & OFFSET_MASK) + 8192)
    finally:
        os.close(fd)
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
