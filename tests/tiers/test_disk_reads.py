"""A same-host get of a disk-only object reads the tier's file with preadv
(`kvpool.client.disk_files`): right bytes, and the reader never maps the file."""

from __future__ import annotations

from pathlib import Path

from kvpool.client import Store
from kvpool.client.disk import DATA_FILE
from kvpool.protocol.messages import ReplicaKind
from kvtest.disk import add_disk_node, offload_pool
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.replicas import kinds
from kvtest.stores import open_store
from kvtest.values import MiB, pattern


def value(i: int, size: int) -> bytes:
    return pattern(i, b"preadv..", size)


def _maps() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


def test_a_same_host_disk_read_is_exact_and_maps_nothing(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "on-evict", "--no-promotion-on-hit")
    disk = tmp_path / "disk"
    add_disk_node(p, "8MiB", disk, "64MiB")
    s = open_store(stores, p.address, rpc_timeout=30.0)
    sizes = {i: (3 * MiB + 4096 if i % 4 == 0 else MiB) for i in range(16)}
    for i, size in sizes.items():
        assert s.put(f"k{i}", value(i, size))

    def disk_only() -> list[int]:
        return [i for i in sizes if kinds(s, f"k{i}") == [ReplicaKind.LOCAL_DISK]]

    on_disk = wait_until(disk_only, what="objects on disk only")
    for i in on_disk:
        assert s.get(f"k{i}") == value(i, sizes[i])
        buf = bytearray(sizes[i] + 100)
        s.register_buffer(buf)
        try:
            assert s.get_into(f"k{i}", buf) == sizes[i]
            assert buf[: sizes[i]] == value(i, sizes[i])
        finally:
            s.unregister_buffer(buf)
    assert str(disk / DATA_FILE) not in _maps()
