"""The DFS tier in tests: a pool whose master has `--dfs-root`, the files in its directory, and
waiting until a key's DFS file is its only copy (docs/parts/tiers.md, "The DFS tier").

    from kvtest.pool import PoolFactory, pool  # noqa: F401

    def test_something(pool: PoolFactory, tmp_path: Path, stores: list[Store]) -> None:
        root = tmp_path / "dfs"
        p = dfs_pool(pool, root, "--default-kv-lease-ttl", "0s", nodes=2)
        s = open_store(stores, p.address)          # kvtest.stores
        assert s.put("k", value, DFS)
        p.kill_node(0)
        p.kill_node(1)
        wait_dfs_only(s, ["k"])
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from kvpool.client import Store
from kvpool.client.replicate import ReplicateConfig
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import DFS_DIR
from kvtest.pool import Pool, PoolFactory
from kvtest.procs import wait_until
from kvtest.replicas import kinds
from kvtest.stores import open_store

__all__ = ["DFS", "dfs_files", "dfs_pool", "promote_through_a_helper", "wait_dfs_only"]

#: Put options that ask for one DFS copy.
DFS = ReplicateConfig(dfs_replica_num=1)


def dfs_pool(
    pool: PoolFactory, root: Path, *master_args: str, nodes: int = 1, segment_size: str = "16MiB"
) -> Pool:
    """A pool whose master keeps DFS copies under `root` (`--dfs-root`, then `master_args`)."""
    return pool(
        nodes=nodes, segment_size=segment_size, master_args=("--dfs-root", str(root), *master_args)
    )


def dfs_files(root: Path) -> list[str]:
    """The names in the DFS directory under `root`, sorted (files and `.tmp` files)."""
    return sorted(os.listdir(root / DFS_DIR))


def promote_through_a_helper(
    p: Pool, s: Store, stores: list[Store], root: Path, key: str, value: bytes, what: str
) -> None:
    """Promote `key`, whose only copy is its DFS file, back to memory: a Store that gives
    16 MiB of memory and sees the DFS directory at `root` joins (the promotion runs there),
    `s` reads `key` twice (the default admission threshold; both reads give `value`), and the
    wait (20 s at most) ends once `key` has a memory replica beside its file."""
    open_store(stores, p.address, segment_size="16MiB", dfs_root=str(root))
    for _ in range(2):
        assert s.get(key) == value
    both = [ReplicaKind.MEMORY, ReplicaKind.DFS]
    wait_until(lambda: kinds(s, key) == both, timeout=20, what=what)


def wait_dfs_only(s: Store, keys: Iterable[str], what: str = "memory gone") -> None:
    """Wait (20 s at most) until every key's only replica is its DFS file."""
    wanted = list(keys)
    wait_until(lambda: all(kinds(s, k) == [ReplicaKind.DFS] for k in wanted), timeout=20, what=what)
