"""`Store(read_mode="cached")` remembers disk-tier replicas too (`kvpool.client.locations`):
a get of a disk-only object then reads the tier's file (same host) or asks its node for one
transfer (TCP) without asking the master; a removal, a promotion or a corrupted file never
makes it return other bytes than the key's value.

Against a real pool: a master (on-evict offload) and one `kvpool node` with 8 MiB of memory
and a disk tier; the objects are pushed to disk by the puts that follow them.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.client.disk import DATA_FILE
from kvpool.client.locations import Locations
from kvpool.client.replicate import ReplicateConfig
from kvpool.errors import KVPoolError, ObjectNotFound
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import DFS_DIR
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401
from kvtest.procs import freeze, wait_until

MiB = 1 << 20
COUNT = 16


def value(i: int, tag: bytes = b"cached..") -> bytes:
    return (i.to_bytes(8, "little") + tag) * (MiB // 16)


def _pool(pool: PoolFactory, tmp_path: Path, *master: str, disk: str = "64MiB") -> Pool:  # noqa: F811
    p = pool(nodes=0, master_args=("--offload-policy", "on-evict", *master))
    p.add_node("8MiB", "--offload-dir", str(tmp_path / "disk"), "--offload-size", disk)
    return p


def _kinds(s: Store, key: str) -> list[ReplicaKind]:
    return [ReplicaKind(r.kind) for r in s.get_replica_desc(key)]


def _fill(writer: Store) -> list[int]:
    """Put COUNT objects of 1 MiB; answers those held by the disk tier alone."""
    for i in range(COUNT):
        assert writer.put(f"k{i}", value(i))
    return wait_until(  # (each look counts as a read for promotion: not too often)
        lambda: [i for i in range(COUNT) if _kinds(writer, f"k{i}") == [ReplicaKind.LOCAL_DISK]],
        interval=0.1,
        what="objects on disk only",
    )


def _read_and_remember(s: Store, i: int) -> None:
    """Get `k{i}` until `s` remembers its disk place: a read that overlaps a push (of any
    key: moves to disk are pushed too) is not remembered, by design (`Locations.epoch`)."""
    wait_until(
        lambda: s.get(f"k{i}") == value(i) and _remembered_on_disk(s, f"k{i}"),
        what=f"k{i} remembered on disk",
    )


def _locations(s: Store) -> Locations:
    locations = s._locations
    assert locations is not None
    return locations


def _remembered_on_disk(s: Store, key: str) -> bool:
    entry = _locations(s).lookup(key)
    return (
        entry is not None
        and entry.replica is not None
        and entry.replica.kind == ReplicaKind.LOCAL_DISK
    )


def test_a_cached_get_of_a_disk_only_object_does_not_ask_the_master(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = _pool(pool, tmp_path, "--no-promotion-on-hit")
    writer = Store(p.address, rpc_timeout=30.0)
    stores.append(writer)
    shm = Store(p.address, read_mode="cached", location_ttl=60.0, rpc_timeout=1.0)
    stores.append(shm)
    tcp = Store(p.address, read_mode="cached", location_ttl=60.0, protocol="tcp", rpc_timeout=1.0)
    stores.append(tcp)
    on_disk = _fill(writer)[:4]
    for i in on_disk:  # strict the first time: each remembers the disk replica it read
        _read_and_remember(shm, i)
        _read_and_remember(tcp, i)
    buf = bytearray(MiB + 100)
    shm.register_buffer(buf)
    tbuf = bytearray(MiB)
    tcp.register_buffer(tbuf)
    pid = p.master.pid
    freeze(pid)
    try:
        for i in on_disk:  # a frozen master answers nothing: these never ask it
            assert shm.get(f"k{i}") == value(i)
            assert tcp.get(f"k{i}") == value(i)
            assert shm.get_into(f"k{i}", buf) == MiB
            assert buf[:MiB] == value(i)
            assert tcp.get_into(f"k{i}", tbuf) == MiB
            assert tbuf == value(i)
    finally:
        os.kill(pid, signal.SIGCONT)
        shm.unregister_buffer(buf)
        tcp.unregister_buffer(tbuf)


def test_a_removed_disk_object_whose_range_is_reused_is_never_read(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    """With the pushes heard, the removal is forgotten at once; with them not heard, the
    reused range fails the remembered checksum: never another object's bytes."""
    # Short read leases: a removed range is parked until the last lease ends, then reused.
    p = _pool(
        pool, tmp_path, "--no-promotion-on-hit", "--default-kv-lease-ttl", "0.2", disk="20MiB"
    )
    writer = Store(p.address, rpc_timeout=30.0)
    stores.append(writer)
    heard = Store(p.address, read_mode="cached", location_ttl=60.0)
    stores.append(heard)
    deaf = Store(p.address, read_mode="cached", location_ttl=60.0)
    stores.append(deaf)
    deaf._node.rpc.on_push = None  # the pushes are not heard: the checksum alone guards
    _locations(deaf).refresh = None
    on_disk = _fill(writer)
    victims = on_disk[:2]
    places = {}
    for i in victims:
        for s in (heard, deaf):
            _read_and_remember(s, i)
    for i in victims:
        (desc,) = writer.get_replica_desc(f"k{i}")
        places[(str(desc.segment), desc.offset)] = i
        writer.remove(f"k{i}", force=True)
    wait_until(
        lambda: all(_locations(heard).lookup(f"k{i}") is None for i in victims),
        what="the removals pushed to the cached Store",
    )

    def reused() -> bool:  # new objects pushed to disk until one takes a freed range
        n = len(reused.made)  # type: ignore[attr-defined]
        reused.made.append(n)  # type: ignore[attr-defined]
        assert writer.put(f"new{n}", value(n, b"newvalue"))
        held = set()
        for m in reused.made[-32:]:  # type: ignore[attr-defined]
            try:
                descs = writer.get_replica_desc(f"new{m}")
            except ObjectNotFound:  # dropped by the full disk tier's LRU
                continue
            held |= {(str(r.segment), r.offset) for r in descs}
        return bool(held & places.keys())

    reused.made = []  # type: ignore[attr-defined]
    wait_until(reused, timeout=30.0, what="a freed disk range taken by another object")
    for i in victims:
        for s in (heard, deaf):
            with pytest.raises(ObjectNotFound):
                s.get(f"k{i}")
            buf = bytearray(MiB)
            s.register_buffer(buf)
            try:
                with pytest.raises(ObjectNotFound):
                    s.get_into(f"k{i}", buf)
            finally:
                s.unregister_buffer(buf)


def test_a_promotion_is_pushed_and_a_corrupted_file_is_refused(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    """A cached Store forgets a disk place when the object is promoted to memory (pushed);
    one that did not hear it reads the disk place, finds it corrupted (checksum) and takes
    the value from memory through the master."""
    # Past the reads that `_fill` makes while it waits (each counts), not past the loop below.
    p = _pool(pool, tmp_path, "--promotion-admission-threshold", "200")
    writer = Store(p.address, rpc_timeout=30.0)
    stores.append(writer)
    heard = Store(p.address, read_mode="cached", location_ttl=60.0)
    stores.append(heard)
    deaf = Store(p.address, read_mode="cached", location_ttl=60.0)
    stores.append(deaf)
    deaf._node.rpc.on_push = None
    _locations(deaf).refresh = None
    index = _fill(writer)[0]
    key = f"k{index}"
    _read_and_remember(heard, index)
    _read_and_remember(deaf, index)
    (disk,) = [r for r in writer.get_replica_desc(key) if r.kind == ReplicaKind.LOCAL_DISK]
    wait_until(  # reads by a strict Store count until the promotion comes
        lambda: writer.get(key) == value(index) and ReplicaKind.MEMORY in _kinds(writer, key),
        timeout=30.0,
        what="the promotion of the object",
    )
    wait_until(
        lambda: _locations(heard).lookup(key) is None, what="the promotion pushed to the Store"
    )
    assert _remembered_on_disk(deaf, key)
    with open(tmp_path / "disk" / DATA_FILE, "r+b") as f:  # the node's file, page cache shared
        f.seek(disk.offset + 4096)
        f.write(b"\xff" * 4096)
    assert deaf.get(key) == value(index)  # refused by checksum, then read through the master
    assert not _remembered_on_disk(deaf, key)
    assert heard.get(key) == value(index)


def test_a_cached_get_of_a_dfs_only_object_reads_its_file_without_the_master(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = pool(
        nodes=1,
        segment_size="8MiB",
        master_args=("--dfs-root", str(root), "--default-kv-lease-ttl", "0s"),
    )
    writer = Store(p.address, rpc_timeout=30.0)
    stores.append(writer)
    cached = Store(p.address, read_mode="cached", location_ttl=60.0, rpc_timeout=1.0)
    stores.append(cached)
    assert writer.put("d", value(7), ReplicateConfig(dfs_replica_num=1))
    for n in range(64):  # plain puts push its memory replica out (the DFS copy stays)
        assert writer.put(f"fill{n}", value(n, b"filler.."))
        if n % 16 == 15 and _kinds(writer, "d") == [ReplicaKind.DFS]:
            break
    assert _kinds(writer, "d") == [ReplicaKind.DFS]
    wait_until(
        lambda: (
            cached.get("d") == value(7)
            and (e := _locations(cached).lookup("d")) is not None
            and e.replica is not None
            and e.replica.kind == ReplicaKind.DFS
        ),
        what="the DFS place remembered",
    )
    buf = bytearray(MiB)
    cached.register_buffer(buf)
    pid = p.master.pid
    freeze(pid)
    try:
        assert cached.get("d") == value(7)
        assert cached.get_into("d", buf) == MiB
        assert buf == value(7)
    finally:
        os.kill(pid, signal.SIGCONT)
        cached.unregister_buffer(buf)
    assert cached.batch_get(["d"]) == [value(7)]  # a batch asks the master for a DFS place
    (name,) = os.listdir(root / DFS_DIR)
    os.unlink(root / DFS_DIR / name)  # the file vanishes: never bytes, the entry forgotten
    with pytest.raises(KVPoolError):
        cached.get("d")
    assert _locations(cached).lookup("d") is None


def test_a_cached_dfs_get_with_a_hot_cache_asks_the_master_nothing(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    """A DFS file is read here, never over TCP: the hot cache is not offered it (asking
    whether its "segment" is reached over TCP would ask the master for a segment that is
    none, on every get)."""
    root = tmp_path / "dfs"
    p = pool(
        nodes=1,
        segment_size="8MiB",
        master_args=("--dfs-root", str(root), "--default-kv-lease-ttl", "0s"),
    )
    writer = Store(p.address, rpc_timeout=30.0)
    stores.append(writer)
    hot = Store(
        p.address, read_mode="cached", location_ttl=60.0, hot_cache_size=8 * MiB, rpc_timeout=30.0
    )
    stores.append(hot)
    assert writer.put("d", value(3), ReplicateConfig(dfs_replica_num=1))
    for n in range(64):  # plain puts push its memory replica out (the DFS copy stays)
        assert writer.put(f"fill{n}", value(n, b"filler.."))
        if n % 16 == 15 and _kinds(writer, "d") == [ReplicaKind.DFS]:
            break
    assert _kinds(writer, "d") == [ReplicaKind.DFS]
    wait_until(
        lambda: (
            hot.get("d") == value(3)
            and (e := _locations(hot).lookup("d")) is not None
            and e.replica is not None
        ),
        what="the DFS place remembered",
    )
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(bytes(hot.get("d"))), daemon=True)
    pid = p.master.pid
    freeze(pid)
    try:
        reader.start()
        reader.join(timeout=5.0)  # a question to the frozen master would wait 30 s
        assert not reader.is_alive(), "the cached DFS get waited for the master"
    finally:
        os.kill(pid, signal.SIGCONT)
        if reader.is_alive():
            reader.join(timeout=60.0)
    assert got == [value(3)]
