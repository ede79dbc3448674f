"""On-evict filling, as `kvpool bench tiers` does it, repeated: every move to disk finds its
source whole, and every object written reads back exactly (docs/parts/tiers.md, "the
intermittent loss during on-evict filling")."""

from __future__ import annotations

import os
from pathlib import Path

from kvpool.client import Store
from kvpool.protocol.messages import ReplicaKind
from kvtest.disk import offload_pool
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.replicas import kinds
from kvtest.stores import open_store, stores_last_first  # noqa: F401
from kvtest.values import MiB

MEMORY = 16 * MiB


def value(key: str) -> bytes:
    head = key.encode().ljust(16, b".")
    return head + os.urandom(16) * ((MiB - 16) // 16)


def test_rounds_of_on_evict_filling_lose_nothing_and_move_no_wrong_source(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "on-evict", "--no-promotion-on-hit")
    owner = open_store(
        stores,
        p.address,
        segment_size=MEMORY,
        offload_dir=str(tmp_path / "disk"),
        offload_size=256 * MiB,
        rpc_timeout=30.0,
    )
    client = open_store(stores, p.address, rpc_timeout=30.0)
    for rnd in range(3):
        owner.remove_all(force=True)
        written: dict[str, bytes] = {}
        for phase, count in (("m", 4), ("d", 4), ("f", 3 * MEMORY // MiB)):
            for i in range(count):
                key = f"r{rnd}-{phase}{i}"
                written[key] = value(key)
                assert client.put(key, written[key])
            if phase == "m":
                for i in range(count):  # read once: leases and touches, as the benchmark
                    assert client.get(f"r{rnd}-m{i}") == written[f"r{rnd}-m{i}"]
        first = f"r{rnd}-f0"
        wait_until(
            lambda: ReplicaKind.LOCAL_DISK in kinds(client, first),  # noqa: B023 (waited on here)
            what="the first filler on disk",
        )
        for key, data in written.items():
            assert client.get(key) == data, key
        tasks = owner.task_stats
        assert tasks is not None
        assert tasks.failed == 0
