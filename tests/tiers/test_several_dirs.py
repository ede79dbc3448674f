"""A node with several `--offload-dir` (`DiskTierSet`): one tier file per directory, offloads
spread over them by free space, and each directory's objects served again after a restart."""

from __future__ import annotations

from pathlib import Path

from kvpool.client import Store
from kvpool.client.disk import DATA_FILE
from kvpool.protocol.messages import ReplicaKind
from kvtest.disk import offload_pool
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.stores import open_store
from kvtest.values import MiB, pattern


def value(i: int) -> bytes:
    return pattern(i, b"two-dirs")


def _node(p: Pool, dirs: list[Path]) -> None:
    args = [a for d in dirs for a in ("--offload-dir", str(d))]
    p.add_node("8MiB", *args, "--offload-size", "16MiB")


def _disk_segments(s: Store, n: int) -> dict[str, list[int]]:
    """Disk segment name -> the objects with a replica there."""
    out: dict[str, list[int]] = {}
    for i in range(n):
        for r in s.get_replica_desc(f"k{i}"):
            if r.kind == ReplicaKind.LOCAL_DISK:
                out.setdefault(str(r.segment), []).append(i)
    return out


def test_a_node_spreads_its_offloads_over_several_directories_and_serves_both_again(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "on-evict", "--no-promotion-on-hit")
    dirs = [tmp_path / "disk-a", tmp_path / "disk-b"]
    _node(p, dirs)
    assert p.nodes[0].output().count("disk tier") == 2
    s = open_store(stores, p.address, rpc_timeout=30.0)
    n = 24  # 3x the memory: most of it goes to disk
    for i in range(n):
        assert s.put(f"k{i}", value(i))
    on_disk = wait_until(lambda: (d := _disk_segments(s, n)) and len(d) == 2 and d, timeout=20)
    counts = sorted(len(v) for v in on_disk.values())
    assert counts[0] >= counts[1] // 2, on_disk  # spread, not one full before the other
    for d in dirs:
        assert (d / DATA_FILE).stat().st_size == 16 * MiB
    assert p.stop_node(0) == 0
    _node(p, dirs)
    back = [i for v in on_disk.values() for i in v]
    wait_until(lambda: all(s.exists(f"k{i}") for i in back), timeout=20, what="both dirs back")
    for i in back:
        assert s.get(f"k{i}") == value(i)
