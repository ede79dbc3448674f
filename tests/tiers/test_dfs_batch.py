"""Batched DFS puts (docs/parts/tiers.md, "The DFS tier"): `batch_put` with
`dfs_replica_num=1` is one BatchPutStart whose keys each get a DFS replica; the writer writes
every file before the memory writes, a key whose file fails is revoked alone and leaves no
file; upserts write the new value's file and the old one's goes; arena Stores take PutStart
for a put that asks for a DFS copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvpool.client import Store
from kvpool.errors import ErrorCode
from kvpool.protocol.messages import BatchPutStart, ReplicaKind
from kvpool.protocol.tiers import DFS_DIR
from kvtest.dfs import DFS, dfs_files, dfs_pool, wait_dfs_only
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.replicas import dfs_file_id, kinds
from kvtest.stores import open_store
from kvtest.values import pattern

KiB = 1 << 10
SIZE = 256 * KiB


def value(i: int, tag: bytes = b"dfsbatch") -> bytes:
    return pattern(i, tag, SIZE)


class _Counted:
    """Counts the requests a Store sends, by type (wraps its rpc client's `call_as`)."""

    def __init__(self, s: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[str] = []
        rpc = s._node.rpc
        real = rpc.call_as

        def call_as(req: Any, *a: Any, **kw: Any) -> Any:
            self.seen.append(type(req).__name__)
            return real(req, *a, **kw)

        monkeypatch.setattr(rpc, "call_as", call_as)

    def count(self, name: str) -> int:
        return self.seen.count(name)


def test_a_dfs_batch_is_one_batch_put_start_and_every_key_reads_from_its_file(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root, "--default-kv-lease-ttl", "0s", nodes=2, segment_size="32MiB")
    s = open_store(stores, p.address)
    calls = _Counted(s, monkeypatch)
    keys = [f"k{i}" for i in range(32)]
    assert s.batch_put(keys, [value(i) for i in range(32)], DFS) == [ErrorCode.OK] * 32
    assert calls.count(BatchPutStart.__name__) == 1
    assert calls.count("PutStart") == 0  # not key by key
    assert all(kinds(s, k) == [ReplicaKind.MEMORY, ReplicaKind.DFS] for k in keys)
    assert len(dfs_files(root)) == 32
    assert not any(f.endswith(".tmp") for f in dfs_files(root))
    p.kill_node(0)
    p.kill_node(1)
    wait_dfs_only(s, keys, what="every memory replica gone")
    assert s.batch_get(keys) == [value(i) for i in range(32)]
    for i in (0, 17, 31):
        assert s.get(keys[i]) == value(i)


def test_a_key_whose_dfs_file_fails_is_revoked_alone_and_leaves_no_file(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root, segment_size="32MiB")
    s = open_store(stores, p.address)
    assert s.put("first", value(99), DFS)  # learns the file ids: taken in increasing order
    step = dfs_file_id(s, "first") + SIZE  # the next id
    # The fifth key's temporary path is a directory: its file cannot be written.
    blocker = root / DFS_DIR / f"{step + 4 * SIZE:016x}.tmp"
    blocker.mkdir()
    keys = [f"b{i}" for i in range(8)]
    got = s.batch_put(keys, [value(i) for i in range(8)], DFS)
    assert got[4] == ErrorCode.TRANSFER_FAIL
    assert got[:4] + got[5:] == [ErrorCode.OK] * 7
    assert not s.exists("b4")
    for i in (0, 1, 2, 3, 5, 6, 7):
        assert kinds(s, keys[i]) == [ReplicaKind.MEMORY, ReplicaKind.DFS]
        assert s.get(keys[i]) == value(i)
    names = set(dfs_files(root))
    assert f"{step + 4 * SIZE:016x}" not in names  # no file of the failed key
    assert {f for f in names if f.endswith(".tmp")} == {blocker.name}  # only the planted one
    assert len(names) == 1 + 7 + 1  # "first", the seven, the planted directory
    blocker.rmdir()
    assert s.batch_put(["b4"], [value(4)], DFS) == [ErrorCode.OK]  # the key is free again
    assert s.get("b4") == value(4)


def test_upserts_write_the_new_values_file_and_the_old_one_goes(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root, "--default-kv-lease-ttl", "0s", segment_size="32MiB")
    s = open_store(stores, p.address)
    assert s.put("u", value(1))  # no copy yet
    assert kinds(s, "u") == [ReplicaKind.MEMORY]
    s.upsert("u", value(2), DFS)  # same size: a copy asked, so new ranges and a file
    assert kinds(s, "u") == [ReplicaKind.MEMORY, ReplicaKind.DFS]
    first = dfs_file_id(s, "u")
    assert dfs_files(root) == [f"{first:016x}"]
    s.upsert("u", value(3, b"upserted")[: SIZE // 2], DFS)  # another size: new file, old goes
    second = dfs_file_id(s, "u")
    assert second != first
    wait_until(lambda: dfs_files(root) == [f"{second:016x}"], what="the old value's file removed")
    s.upsert("u", value(4, b"upserted")[: SIZE // 2])  # same size in place: the file too
    assert dfs_file_id(s, "u") == second
    keys = [f"bu{i}" for i in range(6)]
    assert s.batch_upsert(keys, [value(i) for i in range(6)], DFS) == [ErrorCode.OK] * 6
    assert s.batch_upsert(keys[:3], [value(i, b"secondup") for i in range(3)], DFS) == [0] * 3
    assert all(kinds(s, k) == [ReplicaKind.MEMORY, ReplicaKind.DFS] for k in keys)
    wait_until(lambda: len(dfs_files(root)) == 7, what="one file per object")
    p.kill_node(0)
    wait_dfs_only(s, ["u"])
    assert s.get("u") == value(4, b"upserted")[: SIZE // 2]
    for i in range(6):
        assert s.get(keys[i]) == value(i, b"secondup" if i < 3 else b"dfsbatch")


def test_an_arena_store_takes_put_start_for_a_dfs_copy(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root, segment_size="32MiB")
    for mode in ("wait", "nowait"):
        s = open_store(stores, p.address, arena_size="4MiB", write_mode=mode)
        assert s.put(f"a-{mode}", value(1), DFS)
        assert s.batch_put([f"ab-{mode}"], [value(2)], DFS) == [ErrorCode.OK]
        assert s.put(f"plain-{mode}", value(3))
        s.flush()
        assert kinds(s, f"a-{mode}") == [ReplicaKind.MEMORY, ReplicaKind.DFS]
        assert kinds(s, f"ab-{mode}") == [ReplicaKind.MEMORY, ReplicaKind.DFS]
        assert kinds(s, f"plain-{mode}") == [ReplicaKind.MEMORY]
    assert len(dfs_files(root)) == 4
