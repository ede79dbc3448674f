"""Mooncake's SSD offload through the compatibility layer: `setup(..., enable_ssd_offload=True,
ssd_offload_path=PATH)` gives the store kvpool's disk tier, and `get_replica_desc` reports the
replicas that went there as local disk replicas (docs/parts/tiers.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.compat.mooncake import MooncakeDistributedStore
from kvtest.procs import Proc, kvpool_proc

MiB = 1 << 20


@pytest.fixture
def master() -> Iterator[str]:
    proc: Proc = kvpool_proc(
        "master", "--host", "127.0.0.1", "--port", "0", "--offload_on_evict", name="master"
    )
    try:
        yield proc.wait_ready(timeout=30)
    finally:
        proc.stop()


def test_setup_with_ssd_offload_keeps_objects_beyond_memory_on_local_disk(
    master: str, tmp_path: Path
) -> None:
    store = MooncakeDistributedStore()
    rc = store.setup(
        "127.0.0.1",
        "P2PHANDSHAKE",
        16 * MiB,
        16 * MiB,
        "tcp",
        "",
        master,
        enable_ssd_offload=True,
        ssd_offload_path=str(tmp_path / "ssd"),
    )
    assert rc == 0
    try:
        values = {f"k{i}": bytes([i]) * MiB for i in range(48)}  # 3x the memory
        for key, value in values.items():
            assert store.put(key, value) == 0
        for key, value in values.items():
            assert store.get(key) == value
        descs = store.get_replica_desc("k0")
        assert any(d.is_local_disk_replica() for d in descs)
        assert (tmp_path / "ssd" / "kvpool-disk.data").exists()
    finally:
        store.close()


def test_offload_rpc_read_count_counts_disk_reads_served_to_other_clients(
    master: str, tmp_path: Path
) -> None:
    """`get_offload_rpc_read_count()`: the reads of this store's disk tier that its transfer
    server served others (Mooncake's offload RPC reads); its own reads are not counted."""
    from kvpool.client import Store
    from kvpool.protocol.messages import ReplicaKind

    store = MooncakeDistributedStore()
    rc = store.setup(
        "127.0.0.1",
        "P2PHANDSHAKE",
        16 * MiB,
        16 * MiB,
        "tcp",
        "",
        master,
        enable_ssd_offload=True,
        ssd_offload_path=str(tmp_path / "ssd"),
    )
    assert rc == 0
    try:
        values = {f"k{i}": bytes([i]) * MiB for i in range(48)}  # 3x the memory
        for key, value in values.items():
            assert store.put(key, value) == 0
        with Store(master, protocol="tcp") as other:
            on_disk = [
                k
                for k in values
                if [ReplicaKind(d.kind) for d in other.get_replica_desc(k)]
                == [ReplicaKind.LOCAL_DISK]
            ]
            assert len(on_disk) >= 8
            assert store.get(on_disk[0]) == values[on_disk[0]]  # its own read: not counted
            assert store.get_offload_rpc_read_count() == 0
            for k in on_disk[:8]:
                assert other.get(k) == values[k]
            assert store.get_offload_rpc_read_count() >= 8
    finally:
        store.close()
    assert store.get_offload_rpc_read_count() == 0  # closed: no server
