"""Reading disk-tier replicas from their file with preadv (`kvpool.client.disk_files`): what
is opened, what is refused (the caller then reads another way), bounds and closing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from kvpool.client import disk_files
from kvpool.client.disk_files import DiskFiles
from kvpool.errors import ErrorCode
from kvpool.transfer.location import SegmentLocation
from kvpool.transfer.memory import DISK_FILE_NAME

MiB = 1 << 20
SIZE = 4 * MiB
HOST = "host-a"


@pytest.fixture
def tier_file(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    """A disk-tier data file of SIZE bytes held open by this process, as a node holds it."""
    data = os.urandom(SIZE)
    path = tmp_path / DISK_FILE_NAME
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        yield fd, data
    finally:
        os.close(fd)


def _loc(fd: int, name: str = "disk/1", host: str = HOST, size: int = SIZE) -> SegmentLocation:
    return SegmentLocation(name, size, host, "", f"/proc/{os.getpid()}/fd/{fd}")


def test_a_same_host_disk_replica_is_read_and_hashed_from_the_file(
    tier_file: tuple[int, bytes],
) -> None:
    fd, data = tier_file
    files = DiskFiles(HOST)
    try:
        for offset, n in ((0, 4096), (MiB + 512, 3 * disk_files.PIECE // 2), (SIZE - 10, 10)):
            dest = bytearray(n)
            got = files.read(memoryview(dest), _loc(fd), offset, True)
            assert got == (ErrorCode.OK, xxhash.xxh3_64_intdigest(data[offset : offset + n]))
            assert dest == data[offset : offset + n]
        dest = bytearray(100)
        assert files.read(memoryview(dest), _loc(fd), 0, False) == (ErrorCode.OK, None)
    finally:
        files.close()


def test_what_is_not_a_disk_tier_file_of_this_host_is_left_to_the_caller(
    tier_file: tuple[int, bytes], tmp_path: Path
) -> None:
    fd, _ = tier_file
    other = tmp_path / "memfd-like"
    other.write_bytes(b"\0" * SIZE)
    other_fd = os.open(other, os.O_RDONLY | os.O_CLOEXEC)
    files = DiskFiles(HOST)
    dest = memoryview(bytearray(16))
    try:
        assert files.read(dest, _loc(fd, host="host-b"), 0, True) is None
        assert files.read(dest, _loc(other_fd, "disk/2"), 0, True) is None
        assert files.read(dest, _loc(fd, "disk/3", size=SIZE // 2), 0, True) is None
        no_path = SegmentLocation("disk/4", SIZE, HOST, "127.0.0.1:1", "")
        assert files.read(dest, no_path, 0, True) is None
        assert files.read(dest, _loc(fd, "disk/5"), SIZE - 8, True) == (
            ErrorCode.INVALID_PARAMS,
            None,
        )
        assert files.read(dest, _loc(fd, "disk/5"), -1, True) == (ErrorCode.INVALID_PARAMS, None)
    finally:
        files.close()
        os.close(other_fd)


def test_open_files_are_bounded_and_closed(
    tier_file: tuple[int, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    fd, data = tier_file
    monkeypatch.setattr(disk_files, "MAX_OPEN", 2)
    before = set(os.listdir("/proc/self/fd"))
    files = DiskFiles(HOST)
    dest = memoryview(bytearray(8))
    for i in range(5):
        assert files.read(dest, _loc(fd, f"disk/{i}"), 0, False) == (ErrorCode.OK, None)
        assert len(set(os.listdir("/proc/self/fd")) - before) <= 2
    assert bytes(dest) == data[:8]
    files.close()
    files.close()
    assert set(os.listdir("/proc/self/fd")) - before == set()
    assert files.read(dest, _loc(fd, "disk/9"), 0, False) is None
