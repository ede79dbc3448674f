"""A client that sees the DFS directory at another path than the master (`Store(dfs_root=)`,
`kvpool node --dfs-root`, `kvpool up --dfs-root`; `kvpool.client.dfs.attach`): its DFS files
are read and written under its own path, which must be an existing directory, one per
process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvpool.client import Store, dfs
from kvpool.errors import InvalidParams
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import DFS_DIR
from kvtest.dfs import DFS, dfs_pool, wait_dfs_only
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import kvpool_up, run_kvpool
from kvtest.replicas import kinds
from kvtest.stores import open_store
from kvtest.values import pattern


def value(i: int) -> bytes:
    return pattern(i, b"dfs-root")


def test_a_dfs_root_must_be_an_existing_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    for bad, why in (
        (str(tmp_path / "missing"), "does not exist"),
        (str(tmp_path / "file"), "is not a directory"),
        ("", "expected a directory path"),
    ):
        with pytest.raises(InvalidParams, match=why):
            Store("127.0.0.1:1", dfs_root=bad)  # refused before any connection
    assert dfs.local_root() is None


def test_a_client_reads_and_writes_through_its_own_mount_of_the_dfs_directory(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "shared"
    alias = tmp_path / "here"  # the same directory, seen at another path
    root.mkdir()
    alias.symlink_to(root, target_is_directory=True)
    p = dfs_pool(pool, root)
    used: list[str] = []
    real = dfs.dfs_file

    def spy(base: str, file_id: int) -> str:
        used.append(base)
        return real(base, file_id)

    monkeypatch.setattr(dfs, "dfs_file", spy)
    s = open_store(stores, p.address, dfs_root=str(alias))
    assert dfs.local_root() == str(alias)
    with pytest.raises(InvalidParams, match="one path per process"):
        Store(p.address, dfs_root=str(root))  # another path in the same process
    for i in range(3):
        assert s.put(f"a{i}", value(i), DFS)
    assert len(os.listdir(alias / DFS_DIR)) == 3
    p.kill_node(0)
    wait_dfs_only(s, ["a0"], what="the memory replica gone")
    for i in range(3):  # read from the files, through this process's path
        assert s.get(f"a{i}") == value(i)
    assert used and set(used) == {str(alias)}
    s.close()
    assert dfs.local_root() is None  # the last Store that named it is closed


def test_kvpool_node_refuses_a_dfs_root_that_is_not_a_directory(tmp_path: Path) -> None:
    for bad in (tmp_path / "missing", tmp_path / "file"):
        if bad.name == "file":
            bad.write_bytes(b"x")
        args = ["node", "--master", "127.0.0.1:1", "--dfs-root", str(bad)]
        done = run_kvpool(*args)
        assert done.returncode == 2, done
        assert "--dfs-root" in done.stderr


def test_kvpool_up_gives_its_master_and_node_the_dfs_root(
    tmp_path: Path, stores: list[Store]
) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    up = kvpool_up("--dfs-root", str(root))
    try:
        address = up.wait_ready(timeout=60)
        s = open_store(stores, address)
        assert s.put("u", value(1), DFS)
        assert kinds(s, "u") == [ReplicaKind.MEMORY, ReplicaKind.DFS]
        assert len(os.listdir(root / DFS_DIR)) == 1
        assert s.get("u") == value(1)
    finally:
        up.stop()


def test_dfs_fsync_syncs_each_file_before_its_rename_while_a_store_asks(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "shared"
    p = dfs_pool(pool, root)
    synced: list[str] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    plain = open_store(stores, p.address)
    assert plain.put("n0", value(0), DFS)
    assert [f for f in synced if DFS_DIR in f] == []  # off by default
    s = open_store(stores, p.address, dfs_fsync=True)
    assert s.put("s0", value(1), DFS)
    assert len([f for f in synced if f.endswith(".tmp")]) == 1  # before the rename
    s.close()
    assert plain.put("n1", value(2), DFS)
    assert len([f for f in synced if f.endswith(".tmp")]) == 1
    with pytest.raises(InvalidParams, match="dfs_fsync"):
        Store(p.address, dfs_fsync="yes")  # type: ignore[arg-type]
