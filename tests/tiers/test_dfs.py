"""The DFS tier (`kvpool master --dfs-root`, `ReplicateConfig(dfs_replica_num=1)`;
`kvpool.master.dfs`, `kvpool.client.dfs`): the client writes the object's file, readers go
memory -> DFS -> disk, the copy survives SIGKILL of every node, an abandoned write leaves no
file, and a file that vanished is dropped while the object stays readable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvpool.client import Store, dfs
from kvpool.client.replicate import ReplicateConfig
from kvpool.errors import ErrorCode, KVPoolError
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import DFS_DIR
from kvtest.dfs import DFS, dfs_files, dfs_pool, wait_dfs_only
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.replicas import kinds
from kvtest.stores import open_store
from kvtest.values import MiB, pattern


def value(i: int, size: int = MiB) -> bytes:
    return pattern(i, b"dfs-tier", size)


def test_a_dfs_copy_is_written_by_the_client_and_outlives_every_node(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root, "--default-kv-lease-ttl", "0s", nodes=2)
    s = open_store(stores, p.address)
    for i in range(4):
        assert s.put(f"d{i}", value(i, (i + 1) * MiB // 2), DFS)
    assert s.put("plain", value(9))  # no DFS copy asked: no file
    assert kinds(s, "d0") == [ReplicaKind.MEMORY, ReplicaKind.DFS]
    assert kinds(s, "plain") == [ReplicaKind.MEMORY]
    assert len(dfs_files(root)) == 4
    assert not any(f.endswith(".tmp") for f in dfs_files(root))
    p.kill_node(0)
    p.kill_node(1)
    for i in range(4):  # memory first, which is gone: read from the DFS file
        assert s.get(f"d{i}") == value(i, (i + 1) * MiB // 2)
    wait_dfs_only(s, ["d0"])
    assert s.get("d0") == value(0, MiB // 2)
    got = s.batch_get([f"d{i}" for i in range(4)])
    assert got == [value(i, (i + 1) * MiB // 2) for i in range(4)]
    bufs = [bytearray(2 * MiB) for _ in range(2)]
    for b in bufs:
        s.register_buffer(b)
    try:
        sizes = s.batch_get_into(["d2", "d3"], bufs)
        assert sizes == [3 * MiB // 2, 2 * MiB]
        assert bufs[0][: sizes[0]] == value(2, sizes[0])
        assert bufs[1] == value(3, 2 * MiB)
    finally:
        for b in bufs:
            s.unregister_buffer(b)
    with pytest.raises(KVPoolError):
        s.get("plain")
    s.remove("d1")
    wait_until(lambda: len(dfs_files(root)) == 3, what="the removed object's file gone")


def test_a_vanished_dfs_file_is_dropped_and_the_object_read_from_memory(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root)
    s = open_store(stores, p.address)
    for i in range(3):
        assert s.put(f"v{i}", value(i), DFS)
    for name in dfs_files(root):
        os.unlink(root / DFS_DIR / name)
    # The background check finds them (a read would too): the DFS replicas go, memory stays.
    wait_until(
        lambda: all(kinds(s, f"v{i}") == [ReplicaKind.MEMORY] for i in range(3)),
        timeout=20,
        what="vanished DFS replicas dropped",
    )
    for i in range(3):
        assert s.get(f"v{i}") == value(i)


def test_a_dfs_write_abandoned_mid_way_leaves_no_file(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(
        pool, root, "--put-start-discard-timeout", "1s", "--put-start-release-timeout", "1s"
    )
    s = open_store(stores, p.address)
    real = dfs.write

    def dies_mid_write(r: object, mv: memoryview) -> object:
        path = dfs._path(r)  # type: ignore[arg-type]
        assert path is not None
        with open(path + ".tmp", "wb") as f:  # half of the value, then the writer is gone
            f.write(mv[: mv.nbytes // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(dfs, "write", dies_mid_write)
    monkeypatch.setattr(dfs, "remove_failed", lambda replicas: None)  # the writer is gone
    with pytest.raises(KeyboardInterrupt):
        s.put("gone", value(1), DFS)
    monkeypatch.setattr(dfs, "write", real)
    assert any(f.endswith(".tmp") for f in dfs_files(root))  # left behind: the master removes it
    wait_until(lambda: dfs_files(root) == [], timeout=20, what="the abandoned file removed")
    assert s.put("gone", value(2), DFS)  # the key is free again
    assert s.get("gone") == value(2)
    assert len(dfs_files(root)) == 1


def test_batch_puts_take_dfs_copies_too(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root)
    s = open_store(stores, p.address)
    keys = [f"b{i}" for i in range(4)]
    assert s.batch_put(keys, [value(i) for i in range(4)], DFS) == [0] * 4
    assert all(kinds(s, k) == [ReplicaKind.MEMORY, ReplicaKind.DFS] for k in keys)
    assert len(dfs_files(root)) == 4
    # Per key as the batched path answers: an existing key is kept, the others stored.
    got = s.batch_put(["b0", "b9"], [value(7), value(9)], DFS)
    assert got == [ErrorCode.OBJECT_ALREADY_EXISTS, ErrorCode.OK]
    groups = ReplicateConfig(dfs_replica_num=1, group_ids=("g1", "g2"))
    assert s.batch_put(["c1", "c2"], [value(1), value(2)], groups) == [0, 0]
    p.kill_node(0)  # memory gone: every value comes from its file
    wait_dfs_only(s, ["b9"])
    expect = {"b0": 0, "b1": 1, "b2": 2, "b3": 3, "b9": 9, "c1": 1, "c2": 2}
    for k, i in expect.items():
        assert s.get(k) == value(i), k
    assert len(dfs_files(root)) == len(expect)
