"""`DiskFiles`: a Store's reads of disk-tier replicas on this host, with `preadv` on the file.

A disk tier (`kvpool.client.disk`) is one regular file that its node mounts as a LOCAL_DISK
segment and advertises to same-host peers as `/proc/<pid>/fd/<fd>` (`SegmentInfo.shm_path`).
Reading such a replica through a mapping of the file faults every page of the reader's mapping
in on first touch (the mapping is unpopulated: the file may be many times the RAM), which cost
more than the copy itself. Here the reader opens the file once per segment instead (the owner
too, through its own `/proc/<pid>/fd` entry) and reads each replica with `preadv` straight into
the caller's buffer: one kernel copy from the page cache, no page-table work, no intermediate
buffer. The value is hashed (xxh3_64, as every read) piece by piece while each piece is still in
the CPU cache. docs/parts/perf-tiers.md has the measurements.

A file is opened only if the segment is on this host, its path is a `/proc/<pid>/fd/<fd>`
link to a file named `DISK_FILE_NAME`, and it has the segment's size: anything else answers
None (the caller reads the usual way). A stale descriptor (the owner restarted and its directory
was reused) can only yield bytes that fail the checksum, which the caller checks. At most
`MAX_OPEN` files are kept open (the oldest closed first); `close()` closes them all.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from typing import Final

import xxhash

from kvpool.errors import ErrorCode
from kvpool.transfer.location import SegmentLocation
from kvpool.transfer.memory import DISK_FILE_NAME

__all__ = ["MAX_OPEN", "PIECE", "DiskFiles"]

MAX_OPEN: Final = 64
"""Disk-tier files kept open at most (one per disk segment read recently)."""
PIECE: Final = 1 << 20
"""Bytes read and hashed at a time: small enough that the hash reads the piece from the CPU
cache, large enough that one `preadv` per piece costs nothing (docs/parts/perf-tiers.md)."""
_PROC_FD: Final = re.compile(r"^/proc/(\d+)/fd/(\d+)$")


class DiskFiles:
    """Open disk-tier files of this host, by segment name (module docstring). Thread-safe."""

    def __init__(self, host_id: str) -> None:
        self._host_id = host_id
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def read(
        self, dest: memoryview, location: SegmentLocation, offset: int, want_hash: bool
    ) -> tuple[ErrorCode, int | None] | None:
        """Read `dest.nbytes` bytes at `offset` of the disk segment at `location` into `dest`
        (a flat byte view); (code, xxh3_64 of the value when `want_hash`), or None when the
        segment is not a disk-tier file this process can open (the caller reads it another
        way)."""
        n = dest.nbytes
        if offset < 0 or offset + n > location.size:
            return ErrorCode.INVALID_PARAMS, None  # never read outside the segment
        fd = self._fd(location)
        if fd < 0:
            return None
        hasher = xxhash.xxh3_64() if want_hash else None
        pos = 0
        try:
            while pos < n:
                end = min(n, pos + PIECE)
                part = dest[pos:end]
                got = os.preadv(fd, [part], offset + pos)
                if got <= 0:
                    return ErrorCode.TRANSFER_FAIL, None  # the file shrank under us
                if hasher is not None:
                    hasher.update(part[:got])
                pos += got
        except OSError:
            self.forget(location.name)
            return ErrorCode.TRANSFER_FAIL, None
        return ErrorCode.OK, None if hasher is None else hasher.intdigest()

    def _fd(self, location: SegmentLocation) -> int:
        name = location.name
        with self._lock:
            fd = self._fds.get(name)
            if fd is not None:
                self._fds.move_to_end(name)
                return fd
            if self._closed:
                return -1
        fd = _open(location, self._host_id)
        if fd < 0:
            return -1
        with self._lock:
            if self._closed or name in self._fds:
                os.close(fd)
                return self._fds.get(name, -1)
            self._fds[name] = fd
            while len(self._fds) > MAX_OPEN:
                _, old = self._fds.popitem(last=False)
                os.close(old)
        return fd

    def forget(self, name: str) -> None:
        """Close the file of segment `name`, if open (its read failed)."""
        with self._lock:
            fd = self._fds.pop(name, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every file (idempotent); later reads answer None."""
        with self._lock:
            self._closed = True
            fds = list(self._fds.values())
            self._fds.clear()
        for fd in fds:
            os.close(fd)


def _open(location: SegmentLocation, host_id: str) -> int:
    """A read-only descriptor of the disk-tier file at `location`, or -1 when it is none."""
    path = location.shm_path
    if not path or location.host_id != host_id or _PROC_FD.match(path) is None:
        return -1
    try:
        if os.path.basename(os.readlink(path)) != DISK_FILE_NAME:
            return -1
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        if os.fstat(fd).st_size != location.size:
            os.close(fd)
            return -1
    except OSError:
        os.close(fd)
        return -1
    return fd
