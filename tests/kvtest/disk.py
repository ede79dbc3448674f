"""The disk tier in tests: a pool whose master offloads, nodes with `--offload-dir`, and bytes
spoilt in a node's data file (docs/parts/tiers.md).

    p = offload_pool(pool, "eager", "--no-promotion-on-hit")
    add_disk_node(p, "16MiB", tmp_path / "disk", "16MiB")
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from kvpool.client import Store
from kvpool.client.disk import DATA_FILE
from kvpool.protocol.messages import ReplicaKind
from kvtest.pool import Pool, PoolFactory
from kvtest.procs import Proc, wait_until
from kvtest.replicas import kinds, replica_offset

__all__ = ["add_disk_node", "offload_pool", "spoil_disk_copy", "wait_offloaded"]


def offload_pool(pool: PoolFactory, policy: str, *master_args: str) -> Pool:
    """A master with `--offload-policy policy` (then `master_args`) and no node yet."""
    return pool(nodes=0, master_args=("--offload-policy", policy, *master_args))


def add_disk_node(p: Pool, memory: str, directory: Path, disk: str, *extra: str) -> Proc:
    """One more node: `memory` of memory and a disk tier of `disk` in `directory`."""
    return p.add_node(memory, "--offload-dir", str(directory), "--offload-size", disk, *extra)


def wait_offloaded(s: Store, keys: Iterable[str]) -> None:
    """Wait (20 s at most) until every key has a memory and a disk replica, and only those."""
    wanted = list(keys)
    both = [ReplicaKind.MEMORY, ReplicaKind.LOCAL_DISK]
    wait_until(
        lambda: all(kinds(s, k) == both for k in wanted), timeout=20, what="every object offloaded"
    )


def spoil_disk_copy(s: Store, key: str, directory: Path) -> None:
    """4 KiB of 0xff over `key`'s disk copy, 8 KiB into it, in the data file in `directory`
    (written while its node runs: the node's mapping sees the change)."""
    at = replica_offset(s, key, ReplicaKind.LOCAL_DISK) + 8192
    fd = os.open(directory / DATA_FILE, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xff" * 4096, at)
    finally:
        os.close(fd)
