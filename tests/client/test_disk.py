"""The disk tier's files on their own (`kvpool.client.disk`): journal replay, verification of
every object at open, torn and corrupt data refused, bounded and exclusive directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from kvpool.client.disk import DATA_FILE, JOURNAL_FILE, DiskTier
from kvpool.errors import InvalidParams
from kvpool.protocol.messages import (
    ReplicaDesc,
    ReplicaKind,
    ReplicaStatus,
    ReplicaTask,
    SegmentName,
    TaskType,
    TenantId,
)
from kvpool.transfer.memory import SegmentMemory

MiB = 1 << 20


def _write(tier: DiskTier, mem: SegmentMemory, key: str, offset: int, data: bytes) -> None:
    """What the task executor does: the bytes land in the mapped file, then the tier journals."""
    mem.buffer[offset : offset + len(data)] = data
    desc = ReplicaDesc(
        1,
        ReplicaKind.LOCAL_DISK,
        ReplicaStatus.PROCESSING,
        SegmentName(mem.name),
        offset,
        len(data),
    )
    task = ReplicaTask(
        "t", TaskType.COPY, key, TenantId("default"), len(data),
        int(xxhash.xxh3_64_intdigest(data)), desc, [desc], [],
    )  # fmt: skip
    tier.on_task_written(task)


def _open(path: Path, size: int = 8 * MiB) -> tuple[DiskTier, SegmentMemory]:
    tier = DiskTier(str(path), size)
    mem = SegmentMemory.map_file("disk/0", tier.data_path, size, populate=False)
    tier.segment = mem
    return tier, mem


def test_objects_written_are_found_again_after_reopening(tmp_path: Path) -> None:
    tier, mem = _open(tmp_path)
    _write(tier, mem, "a", 0, b"x" * 5000)
    _write(tier, mem, "b", 8192, b"y" * MiB)
    mem.close()
    tier.close()
    again = DiskTier(str(tmp_path), 8 * MiB)
    try:
        assert sorted((e.key, e.offset, e.size) for e in again.entries()) == [
            ("a", 0, 5000),
            ("b", 8192, MiB),
        ]
        assert (again.stats.verified, again.stats.refused) == (2, 0)
    finally:
        again.close()


def test_an_object_corrupted_or_truncated_while_closed_is_refused(tmp_path: Path) -> None:
    tier, mem = _open(tmp_path)
    _write(tier, mem, "good", 0, b"g" * 4096)
    _write(tier, mem, "bad", 4096, b"b" * 4096)
    mem.close()
    tier.close()
    with open(tmp_path / DATA_FILE, "r+b") as f:
        f.seek(4096 + 100)
        f.write(b"X")
    again = DiskTier(str(tmp_path), 8 * MiB)
    try:
        assert [e.key for e in again.entries()] == ["good"]
        assert again.stats.refused == 1
    finally:
        again.close()
    # A data file cut short is another size: the tier starts empty, nothing stale is served.
    os.truncate(tmp_path / DATA_FILE, 4096)
    fresh = DiskTier(str(tmp_path), 8 * MiB)
    try:
        assert fresh.entries() == []
        assert os.path.getsize(tmp_path / DATA_FILE) == 8 * MiB
    finally:
        fresh.close()


def test_a_torn_journal_record_ends_the_journal_there(tmp_path: Path) -> None:
    tier, mem = _open(tmp_path)
    _write(tier, mem, "a", 0, b"a" * 4096)
    _write(tier, mem, "b", 4096, b"b" * 4096)
    mem.close()
    tier.close()
    journal = tmp_path / JOURNAL_FILE
    os.truncate(journal, os.path.getsize(journal) - 3)  # a crash while appending "b"
    again = DiskTier(str(tmp_path), 8 * MiB)
    try:
        assert [e.key for e in again.entries()] == ["a"]
        assert again.stats.torn_records > 0
    finally:
        again.close()


def test_a_range_written_again_replaces_the_objects_it_overlaps(tmp_path: Path) -> None:
    tier, mem = _open(tmp_path)
    _write(tier, mem, "old1", 0, b"1" * 4096)
    _write(tier, mem, "old2", 4096, b"2" * 4096)
    _write(tier, mem, "new", 2048, b"n" * 4096)
    assert [e.key for e in tier.entries()] == ["new"]
    mem.close()
    tier.close()
    again = DiskTier(str(tmp_path), 8 * MiB)
    try:
        assert [e.key for e in again.entries()] == ["new"]
    finally:
        again.close()


def test_space_is_reserved_up_front_and_the_directory_is_exclusive(tmp_path: Path) -> None:
    tier = DiskTier(str(tmp_path), 4 * MiB)
    try:
        st = os.stat(tier.data_path)
        assert st.st_size == 4 * MiB
        assert st.st_blocks * 512 >= 4 * MiB  # allocated, not sparse
        with pytest.raises(InvalidParams, match="in use"):
            DiskTier(str(tmp_path), 4 * MiB)
    finally:
        tier.close()
    DiskTier(str(tmp_path), 4 * MiB).wipe()
    assert not (tmp_path / DATA_FILE).exists()


def test_a_range_the_master_freed_is_journaled_and_not_found_again(tmp_path: Path) -> None:
    tier, mem = _open(tmp_path)
    _write(tier, mem, "gone", 0, b"g" * 4096)
    _write(tier, mem, "kept", 4096, b"k" * 4096)
    tier.on_freed([(SegmentName(mem.name), 0), (SegmentName("other/1"), 4096)])
    assert [e.key for e in tier.entries()] == ["kept"]
    mem.close()
    tier.close()
    again = DiskTier(str(tmp_path), 8 * MiB)
    try:
        assert [e.key for e in again.entries()] == ["kept"]
    finally:
        again.close()
