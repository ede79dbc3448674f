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

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.client.replicate import ReplicateConfig
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import dfs_file
from kvtest.pool import PoolFactory, pool  # noqa: F401

MiB = 1 << 20
DFS = ReplicateConfig(dfs_replica_num=1)


@pytest.fixture
def stores() -> Iterator[list[Store]]:
    made: list[Store] = []
    try:
        yield made
    finally:
        for s in made:
            s.close()


def _file_id(s: Store, key: str) -> int:
    return next(r.offset for r in s.get_replica_desc(key) if r.kind == ReplicaKind.DFS)


def test_a_store_of_another_pool_never_writes_into_this_pools_dfs_directory(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root_a, root_b = tmp_path / "dfs-a", tmp_path / "dfs-b"
    pool_a = pool(nodes=0, master_args=("--dfs-root", str(root_a)))
    pool_b = pool(nodes=0, master_args=("--dfs-root", str(root_b)))
    # Pool A's directory is seen here at its own path (as a client on another mount would).
    a = Store(pool_a.address, segment_size="8MiB", rpc_timeout=10.0, dfs_root=str(root_a))
    stores.append(a)
    b = Store(pool_b.address, segment_size="8MiB", rpc_timeout=10.0)
    stores.append(b)

    value_a, value_b = b"A" * MiB, b"B" * MiB
    assert a.put("ka", value_a, DFS)
    assert b.put("kb", value_b, DFS)
    id_a, id_b = _file_id(a, "ka"), _file_id(b, "kb")

    # Pool A's file still holds pool A's value (pool B's put did not replace it) ...
    got = Path(dfs_file(str(root_a), id_a)).read_bytes()
    assert got == value_a, f"pool A's DFS file now holds {got[:1]!r}... (pool B's value)"
    # ... and pool B's file is where pool B's master (its `--dfs-root`) names it.
    assert Path(dfs_file(str(root_b), id_b)).read_bytes() == value_b
