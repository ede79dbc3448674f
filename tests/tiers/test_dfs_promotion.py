"""Promotion from DFS (docs/parts/tiers.md, "The DFS tier"): reads of an object whose only copy
is its DFS file count toward promotion as disk-only reads do; past the threshold the master
has a client that sees the DFS directory (`kvpool node --dfs-root`, `Store(dfs_root=)`) copy
the file back into memory, checked against the checksum; the DFS replica stays."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.errors import KVPoolError
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import dfs_file
from kvtest.dfs import DFS, dfs_pool, promote_through_a_helper, wait_dfs_only
from kvtest.ops_http import http_base, metrics_text
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.replicas import dfs_file_id, kinds
from kvtest.stores import open_store
from kvtest.values import pattern

MEM = ReplicaKind.MEMORY


def value(i: int) -> bytes:
    return pattern(i, b"promoted")


def test_a_dfs_only_object_read_often_comes_back_to_memory_by_itself(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root, "--promotion-admission-threshold", "3", "--default-kv-lease-ttl", "0s")
    s = open_store(stores, p.address)
    for i in range(3):
        assert s.put(f"p{i}", value(i), DFS)
    p.kill_node(0)  # memory gone: the files are the only copies
    wait_dfs_only(s, [f"p{i}" for i in range(3)], what="every memory replica gone")
    # A node that sees the DFS directory (at the master's path here).
    p.add_node("16MiB", "--dfs-root", str(root))
    for _ in range(3):  # the threshold: three reads from the file
        assert s.get("p0") == value(0)
    assert s.get("p1") == value(1)  # read once: below the threshold
    wait_until(
        lambda: kinds(s, "p0") == [MEM, ReplicaKind.DFS],
        timeout=20,
        what="p0 promoted back to memory",
    )
    assert s.get("p0") == value(0)  # from memory now, its bytes exact
    assert ReplicaKind(s.get_replica_desc("p0")[0].kind) == MEM  # memory first
    assert kinds(s, "p1") == kinds(s, "p2") == [ReplicaKind.DFS]


def test_a_store_with_dfs_root_and_memory_runs_the_promotion(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root, "--default-kv-lease-ttl", "0s")
    s = open_store(stores, p.address)
    assert s.put("q", value(7), DFS)
    p.kill_node(0)
    wait_dfs_only(s, ["q"])
    # The master's own nodes are gone; a Store that contributes memory and sees the directory.
    promote_through_a_helper(p, s, stores, root, "q", value(7), "q promoted")
    assert s.get("q") == value(7)


def test_a_corrupt_dfs_file_is_never_promoted(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root, "--default-kv-lease-ttl", "0s", "--http-port", "0")
    base = http_base(p.master)
    s = open_store(stores, p.address)
    assert s.put("bad", value(3), DFS)
    p.kill_node(0)
    wait_dfs_only(s, ["bad"])
    file_id = dfs_file_id(s, "bad")
    with open(dfs_file(str(root), file_id), "r+b") as f:  # same size, other bytes
        f.seek(4096)
        f.write(b"\xff" * 4096)
    p.add_node("16MiB", "--dfs-root", str(root))
    for _ in range(2):
        with pytest.raises(KVPoolError):
            s.get("bad")  # the reader refuses it too
    wait_until(
        lambda: metric(base, "kvpool_tier_promote_failed_total") >= 1,
        timeout=20,
        what="the promotion refused",
    )
    assert kinds(s, "bad") == [ReplicaKind.DFS]  # no memory replica of wrong bytes


def metric(base: str, name: str) -> float:
    got = re.search(rf"^{name} (\S+)$", metrics_text(base), re.M)
    return float(got.group(1)) if got else 0.0
