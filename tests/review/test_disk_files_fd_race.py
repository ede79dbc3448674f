"""Review finding on `DiskFiles` (src/kvpool/client/disk_files.py), which says it is
thread-safe.

`read` takes a descriptor from `_fd` under the lock and then uses it *outside* the lock
(`os.preadv(fd, ...)`), while another thread's `_fd` may close it at the same time: when a
65th disk segment is opened the oldest descriptor is closed (`MAX_OPEN`), and `forget` /
`close` close one too. The kernel hands the freed number to the next `open` (or socket) of the
process, so the first thread's `preadv` reads another file: with `verify_checksum=False` a
get returns another value's bytes as OK, with it the get fails with CHECKSUM_MISMATCH although
the replica is intact.

Real files on disk, opened through `/proc/<pid>/fd/<fd>` as a node advertises its disk tier;
the other thread's work is run at the moment the first thread calls `preadv` (a wrapper of
`os.preadv`), which is the interleaving two reader threads of one Store can produce.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.client.disk_files import MAX_OPEN, DiskFiles
from kvpool.transfer.location import SegmentLocation
from kvpool.transfer.memory import DISK_FILE_NAME

_SIZE = 4096
_HOST = "review-host"


@pytest.fixture
def disk_segments(tmp_path: Path) -> Iterator[list[SegmentLocation]]:
    """MAX_OPEN + 1 disk-tier files, segment i filled with byte i, held open by this test."""
    fds: list[int] = []
    locs: list[SegmentLocation] = []
    try:
        for i in range(MAX_OPEN + 1):
            d = tmp_path / f"seg{i}"
            d.mkdir()
            f = d / DISK_FILE_NAME
            f.write_bytes(bytes([i]) * _SIZE)
            fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC)
            fds.append(fd)
            locs.append(
                SegmentLocation(f"seg{i}", _SIZE, _HOST, "", f"/proc/{os.getpid()}/fd/{fd}")
            )
        yield locs
    finally:
        for fd in fds:
            os.close(fd)


def test_a_read_never_returns_another_files_bytes(
    disk_segments: list[SegmentLocation], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = DiskFiles(_HOST)
    decoy_path = tmp_path / "decoy"
    decoy_path.write_bytes(b"\xee" * _SIZE)
    decoys: list[int] = []
    real_preadv = os.preadv
    raced = False

    def other_thread() -> None:
        scratch = memoryview(bytearray(_SIZE))
        for loc in disk_segments[1:]:  # the 65th open closes segment 0's descriptor
            files.read(scratch, loc, 0, False)
        decoys.append(os.open(decoy_path, os.O_RDONLY | os.O_CLOEXEC))  # takes its number

    def preadv(fd: int, buffers: Any, offset: int) -> int:
        nonlocal raced
        if not raced:
            raced = True
            t = threading.Thread(target=other_thread)
            t.start()
            t.join(timeout=30)
            assert not t.is_alive()
        return real_preadv(fd, buffers, offset)

    try:
        dest = memoryview(bytearray(_SIZE))
        monkeypatch.setattr(os, "preadv", preadv)
        code, _ = files.read(dest, disk_segments[0], 0, False) or (None, None)
        monkeypatch.undo()
        assert raced
        # Either an error or segment 0's bytes; never another file's bytes as OK.
        if code is not None and code.name == "OK":
            assert bytes(dest) == b"\x00" * _SIZE, f"read {bytes(dest[:4])!r}... as segment 0"
    finally:
        monkeypatch.undo()
        files.close()
        for fd in decoys:
            os.close(fd)
