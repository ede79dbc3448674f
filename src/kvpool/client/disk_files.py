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


class _Open:
    """One open file and the reads using it: closed once dropped and no read holds it (a
    descriptor closed under a read would be reused by the next `open`, and the read would
    take another file's bytes)."""

    __slots__ = ("dropped", "fd", "users")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.dropped = False


class DiskFiles:
    """Open disk-tier files of this host, by segment name (module docstring). Thread-safe:
    a file is closed only when no read uses it."""

    def __init__(self, host_id: str) -> None:
        self._host_id = host_id
        self._files: OrderedDict[str, _Open] = OrderedDict()
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
        f = self._acquire(location)
        if f is None:
            return None
        hasher = xxhash.xxh3_64() if want_hash else None
        pos = 0
        try:
            while pos < n:
                end = min(n, pos + PIECE)
                part = dest[pos:end]
                got = os.preadv(f.fd, [part], offset + pos)
                if got <= 0:
                    return ErrorCode.TRANSFER_FAIL, None  # the file shrank under us
                if hasher is not None:
                    hasher.update(part[:got])
                pos += got
        except OSError:
            self._release(f)
            f = None
            self.forget(location.name)
            return ErrorCode.TRANSFER_FAIL, None
        finally:
            if f is not None:
                self._release(f)
        return ErrorCode.OK, None if hasher is None else hasher.intdigest()

    def _acquire(self, location: SegmentLocation) -> _Open | None:
        """The open file of `location`, held for one read (`_release`), or None."""
        name = location.name
        with self._lock:
            f = self._files.get(name)
            if f is not None:
                self._files.move_to_end(name)
                f.users += 1
                return f
        if self.is_closed():
            return None
        fd = _open(location, self._host_id)
        if fd < 0:
            return None
        dropped: list[_Open] = []
        with self._lock:
            other = self._files.get(name)
            if other is not None:  # opened by another reader meanwhile
                os.close(fd)
                other.users += 1
                return other
            if self.is_closed():  # (closed while this one opened its file)
                os.close(fd)
                return None
            f = self._files[name] = _Open(fd)
            f.users += 1
            while len(self._files) > MAX_OPEN:
                _, old = self._files.popitem(last=False)
                dropped.append(old)
            closable = [d.fd for d in dropped if self._drop_locked(d)]
        for old_fd in closable:
            os.close(old_fd)
        return f

    def is_closed(self) -> bool:
        return self._closed

    def _release(self, f: _Open) -> None:
        with self._lock:
            f.users -= 1
            close = f.dropped and f.users == 0
        if close:
            os.close(f.fd)

    @staticmethod
    def _drop_locked(f: _Open) -> bool:
        """Mark `f` dropped (under the lock); answers whether the caller closes it now."""
        f.dropped = True
        return f.users == 0

    def forget(self, name: str) -> None:
        """Close the file of segment `name`, if open (its read failed), once no read uses it."""
        with self._lock:
            f = self._files.pop(name, None)
            close = f is not None and self._drop_locked(f)
        if close and f is not None:
            os.close(f.fd)

    def close(self) -> None:
        """Close every file (idempotent; each once no read uses it); later reads answer None."""
        with self._lock:
            self._closed = True
            files = list(self._files.values())
            self._files.clear()
            closable = [f.fd for f in files if self._drop_locked(f)]
        for fd in closable:
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
