"""Review finding (round 3): a process's `dfs_root` redirects the DFS files of every pool.

src/kvpool/client/dfs.py `_path`: `root = _local[0] or r.endpoint`. Once any Store of the
process named where the DFS directory is mounted here (`Store(dfs_root=)`, `attach`), every
DFS replica's file is read, written and removed under that path, whatever master handed the
replica out: the replica's `endpoint` (its master's `--dfs-root`) is ignored. A process that
talks to two pools (a router, a migration or copy tool, a test harness), one of them through a
Store with `dfs_root`, writes the other pool's DFS files into the first pool's directory. File
ids are per master and both start at 0, so the second pool's put *replaces the first pool's
file* of the same id: the first pool's object now has a DFS file with another value's bytes,
which its check does not notice (the file exists) and its readers refuse (checksum), so once
its memory copy goes the object is lost; the second pool's object has no file where its
master looks. docs/parts/tiers.md calls the path "one path per process, since a mount point is
a fact of the host", which is true of one directory, not of every pool's.

Suggested fix: remember the mapping per master root (`endpoint` -> local path) and translate
only replicas whose `endpoint` is the root of the master the attaching Store talks to (the
Store learns it from its first DFS replica, or the master's Welcome/Stats).
"""

from __future__ import annotations

from pathlib import Path

from kvpool.client import Store
from kvpool.protocol.tiers import dfs_file
from kvtest.dfs import DFS, dfs_pool
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.replicas import dfs_file_id
from kvtest.stores import open_store
from kvtest.values import MiB


def test_a_store_of_another_pool_never_writes_into_this_pools_dfs_directory(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root_a, root_b = tmp_path / "dfs-a", tmp_path / "dfs-b"
    pool_a = dfs_pool(pool, root_a, nodes=0)
    pool_b = dfs_pool(pool, root_b, nodes=0)
    # Pool A's directory is seen here at its own path (as a client on another mount would).
    a = open_store(
        stores, pool_a.address, segment_size="8MiB", rpc_timeout=10.0, dfs_root=str(root_a)
    )
    b = open_store(stores, pool_b.address, segment_size="8MiB", rpc_timeout=10.0)

    value_a, value_b = b"A" * MiB, b"B" * MiB
    assert a.put("ka", value_a, DFS)
    assert b.put("kb", value_b, DFS)
    id_a, id_b = dfs_file_id(a, "ka"), dfs_file_id(b, "kb")

    # Pool A's file still holds pool A's value (pool B's put did not replace it) ...
    got = Path(dfs_file(str(root_a), id_a)).read_bytes()
    assert got == value_a, f"pool A's DFS file now holds {got[:1]!r}... (pool B's value)"
    # ... and pool B's file is where pool B's master (its `--dfs-root`) names it.
    assert Path(dfs_file(str(root_b), id_b)).read_bytes() == value_b
