"""Segment memory: shared-memory regions, their mappings, and the quarantine of held mappings.

A segment is one memfd (`memfd_create`, never a name in /dev/shm) mapped `MAP_SHARED |
MAP_POPULATE` by its owner, so every page is allocated and mapped before the first transfer
(first-touch page faults cost far more than the copies into touched memory). A memfd
has no name in any file system: when its owner dies, even by `kill -9`, the kernel frees it as
soon as the last mapping goes, so there is nothing to sweep. A same-host peer reaches it through
`/proc/<owner pid>/fd/<fd>` (the segment's `shm_path`), which the kernel lets only the same user
(ptrace-read access) open, and which stops existing when the owner closes the fd or dies.

`SharedMapping` is one mmap (the owner's or a peer's) with a count of holders. Closing a
mapping that some transfer still holds does not unmap it: it is *quarantined* and unmapped by
the last `release()`; a mapping whose memory some foreign
memoryview still exports stays quarantined and `retry_quarantined()` tries again later. Before a
segment is unmapped it is first removed from every user that could start a new transfer on it
(its close hooks: the transfer server, the engine): a segment is deregistered from every
transport before munmap.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import re
import stat
import threading
from collections.abc import Callable
from typing import Final

from kvpool.config import parse_size
from kvpool.errors import InvalidParams, KVPoolError, TransferError
from kvpool.transfer.location import SegmentLocation, normalize_segment_name
from kvpool.transfer.registration import buffer_address

__all__ = [
    "DISK_FILE_NAME",
    "SegmentMemory",
    "SharedMapping",
    "open_peer_mapping",
    "process_start_time",
    "quarantined_count",
    "retry_quarantined",
]

log = logging.getLogger(__name__)

_MEMFD_PREFIX: Final = "kvpool:"
_PROC_FD_RE: Final = re.compile(r"^/proc/(\d+)/fd/(\d+)$")
DISK_FILE_NAME: Final = "kvpool-disk.data"
"""The data file of a node's disk tier (`kvpool.client.disk`): the one regular file a same-host
peer may map as a segment."""

_quarantine_lock = threading.Lock()
_quarantine: set[SharedMapping] = set()
_hook_tokens = itertools.count(1)


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), or None when there is no such pid.

    A pid plus its start time names one process for the life of the boot, even after pid reuse.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


class SharedMapping:
    """One `MAP_SHARED` mapping with holders; unmapped when closed and no longer held."""

    __slots__ = (
        "__weakref__",
        "_closing",
        "_holders",
        "_lock",
        "_mmap",
        "_view",
        "address",
        "label",
        "size",
    )

    def __init__(
        self, fd: int, size: int, label: str, offset: int = 0, *, populate: bool = True
    ) -> None:
        self.size = size
        self.label = label
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
        self._mmap: mmap.mmap | None = mmap.mmap(fd, size, flags=flags, offset=offset)
        self._view: memoryview | None = memoryview(self._mmap)
        self.address = buffer_address(self._view)
        """Where the mapping starts in this process (copy paths pick chunk sizes by it)."""
        self._lock = threading.Lock()
        self._holders = 0
        self._closing = False

    def flush(self, offset: int, size: int) -> None:
        """msync the pages of [offset, offset + size) to the file behind the mapping (a disk
        tier journals an object only after its bytes are flushed)."""
        m = self._mmap
        if m is None or size <= 0:
            return
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        m.flush(start, min(offset + size, self.size) - start)

    @property
    def view(self) -> memoryview:
        """The whole mapping as a writable byte view (valid while held or owned)."""
        view = self._view
        if view is None:
            raise TransferError(f"mapping {self.label} is closed")
        return view

    @property
    def closed(self) -> bool:
        """True once the memory is unmapped."""
        return self._mmap is None

    @property
    def quarantined(self) -> bool:
        """Closed by its owner but still mapped because something holds it."""
        return self._closing and self._mmap is not None

    @property
    def holders(self) -> int:
        return self._holders

    def acquire(self) -> bool:
        """Hold the mapping for one transfer; False when it is closing (start nothing then)."""
        with self._lock:
            if self._closing:
                return False
            self._holders += 1
            return True

    def release(self) -> None:
        """End one hold; the last release of a closing mapping unmaps it."""
        with self._lock:
            self._holders -= 1
            last = self._closing and self._holders == 0
        if last:
            self._unmap()

    def close(self) -> bool:
        """Close (idempotent). True when unmapped now, False when quarantined until released."""
        with self._lock:
            self._closing = True
            held = self._holders > 0
        if held:
            log.debug("mapping %s quarantined: %d transfer(s) hold it", self.label, self._holders)
            with _quarantine_lock:
                _quarantine.add(self)
            return False
        return self._unmap()

    def _unmap(self) -> bool:
        with self._lock:
            mm, view = self._mmap, self._view
            if mm is None:
                return True
            try:
                if view is not None:
                    view.release()
                    self._view = None
                mm.close()
            except BufferError:
                # Something still exports this memory (a numpy array or memoryview slice made
                # from it): unmapping now would leave it pointing at nothing, so keep the
                # mapping quarantined and retry later.
                log.warning("mapping %s still exported; kept in quarantine", self.label)
                if self._view is None:
                    self._view = memoryview(mm)
                with _quarantine_lock:
                    _quarantine.add(self)
                return False
            self._mmap = None
        with _quarantine_lock:
            _quarantine.discard(self)
        return True

    def _retry(self) -> bool:
        if self._holders > 0:
            return False
        return self._unmap()


def retry_quarantined() -> int:
    """Try again to unmap closed mappings that were still held or exported; returns how many
    remain quarantined."""
    with _quarantine_lock:
        pending = list(_quarantine)
    for m in pending:
        m._retry()
    return quarantined_count()


def quarantined_count() -> int:
    """Mappings that were closed but are still mapped (held by a transfer or exported)."""
    with _quarantine_lock:
        return len(_quarantine)


class SegmentMemory:
    """One pre-faulted shared-memory segment owned by this process.

    Create with `SegmentMemory.create(name, size)`; `.buffer` is the writable memory, `.shm_path`
    what a same-host peer opens. `close()` first runs the close hooks (the transfer server and
    engines that serve it remove it), closes the memfd so no new peer can open it, and unmaps
    the memory once no transfer holds it.
    """

    __slots__ = ("_closed", "_fd", "_hooks", "_lock", "mapping", "name", "shm_path", "size")

    def __init__(
        self, name: str, size: int, fd: int, mapping: SharedMapping, *, shared: bool = True
    ) -> None:
        self.name = name
        self.size = size
        self._fd = fd
        self.mapping = mapping
        self.shm_path = f"/proc/{os.getpid()}/fd/{fd}" if shared else ""
        """What a same-host peer maps; "" for a file segment (peers reach it over TCP)."""
        self._hooks: dict[int, Callable[[SegmentMemory], None]] = {}
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def create(cls, name: str, size: int | str) -> SegmentMemory:
        """A new segment of `size` bytes (an int or "64MiB"), every page touched."""
        clean = normalize_segment_name(name)
        nbytes = parse_size(size, name="segment size", minimum=1)
        retry_quarantined()
        fd = os.memfd_create(f"{_MEMFD_PREFIX}{clean}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            # MAP_POPULATE allocates and maps every page now: faster than posix_fallocate plus
            # populating, and than touching each page from Python (docs/performance.md).
            mapping = SharedMapping(fd, nbytes, f"segment {clean}")
        except OSError as exc:
            os.close(fd)
            raise KVPoolError(f"cannot create segment {clean!r} of {nbytes} bytes: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        log.info("segment %s: %d bytes at /proc/%d/fd/%d", clean, nbytes, os.getpid(), fd)
        return cls(clean, nbytes, fd, mapping)

    @classmethod
    def map_file(
        cls,
        name: str,
        path: str,
        size: int,
        offset: int = 0,
        *,
        populate: bool = True,
        share: bool = False,
    ) -> SegmentMemory:
        """A segment over `size` bytes of the caller's regular file `path` (a file on tmpfs such
        as /dev/shm, or on disk) from `offset` (a multiple of the page size), mapped
        `MAP_SHARED | MAP_POPULATE`: what the pool writes there lands in the file.

        It is not advertised to same-host peers (`shm_path` is "", so they use TCP): they
        verify a segment by its memfd name, and a caller's file carries none. `populate=False`
        maps without faulting the pages in (a disk tier: pages come and go with the page
        cache). `share=True` advertises the file to same-host peers after all (a disk tier's
        `DISK_FILE_NAME` at offset 0: peers map it unpopulated and copy straight from the page
        cache, `open_peer_mapping`). The file must
        not shrink while mounted: touching a page past its end kills the process (SIGBUS),
        the price Mooncake's `mount_segment` pays too. Raises `InvalidParams` for a bad range,
        a path that is not a regular file or cannot be opened read-write.
        """
        clean = normalize_segment_name(name)
        page = mmap.PAGESIZE
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidParams(f"offset: expected an int >= 0, got {offset!r}")
        if offset % page:
            raise InvalidParams(f"offset {offset} is not a multiple of the page size {page}")
        nbytes = parse_size(size, name="segment size", minimum=1)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except (OSError, TypeError, ValueError) as exc:
            raise InvalidParams(f"cannot open {path!r} read-write: {exc}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidParams(f"{path!r} is not a regular file")
            if offset + nbytes > st.st_size:
                raise InvalidParams(
                    f"{path!r}: [{offset}, {offset + nbytes}) is past its end ({st.st_size} bytes)"
                )
            mapping = SharedMapping(
                fd, nbytes, f"segment {clean} ({path})", offset, populate=populate
            )
        except OSError as exc:
            os.close(fd)
            raise KVPoolError(f"cannot map {path!r} as segment {clean!r}: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        log.info("segment %s: %d bytes of %s at offset %d", clean, nbytes, path, offset)
        return cls(clean, nbytes, fd, mapping, shared=share)

    @property
    def buffer(self) -> memoryview:
        """The whole segment as a writable memoryview (do not keep slices past close())."""
        return self.mapping.view

    @property
    def closed(self) -> bool:
        return self._closed

    def add_close_hook(self, hook: Callable[[SegmentMemory], None]) -> int:
        """Run `hook(self)` at the start of close(), before the memory goes; returns a token."""
        with self._lock:
            if self._closed:
                raise TransferError(f"segment {self.name} is closed")
            token = next(_hook_tokens)
            self._hooks[token] = hook
            return token

    def remove_close_hook(self, token: int) -> None:
        with self._lock:
            self._hooks.pop(token, None)

    def close(self) -> None:
        """Deregister from every user, then unmap (or quarantine while held). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            hooks = list(self._hooks.values())
            self._hooks.clear()
        for hook in reversed(hooks):
            try:
                hook(self)
            except Exception:
                log.exception("close hook of segment %s failed", self.name)
        os.close(self._fd)
        self.mapping.close()

    def __enter__(self) -> SegmentMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SegmentMemory({self.name!r}, size={self.size}, shm_path={self.shm_path!r})"


class PeerMapping:
    """A same-host peer's segment mapped here, and the identity of the memory it maps."""

    __slots__ = ("identity", "location", "mapping", "owner_pid", "owner_start")

    def __init__(
        self,
        location: SegmentLocation,
        mapping: SharedMapping,
        pid: int,
        start: int,
        identity: tuple[int, int],
    ) -> None:
        self.location = location
        self.mapping = mapping
        self.owner_pid = pid
        self.owner_start = start
        self.identity = identity  # (st_dev, st_ino) of the memfd

    def owner_alive(self) -> bool:
        """The owner still serves this very memory at `shm_path`.

        False when the owner died (the path is gone), closed the segment, or mounted another
        segment whose fd took the same number (a different inode): in each case this mapping
        is stale and must not be written. One stat() of the /proc link.
        """
        try:
            st = os.stat(self.location.shm_path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity


def open_peer_mapping(location: SegmentLocation) -> PeerMapping:
    """Map the segment a same-host peer serves at `location.shm_path`.

    Verifies that the path is a kvpool memfd of that segment name and of the advertised size,
    so a stale location (owner gone, pid reused) fails here instead of mapping other memory.
    Raises `TransferError` when it cannot be mapped (the caller may fall back to TCP).
    """
    m = _PROC_FD_RE.match(location.shm_path)
    if m is None:
        raise InvalidParams(f"shm_path {location.shm_path!r} is not /proc/<pid>/fd/<fd>")
    pid = int(m.group(1))
    start = process_start_time(pid)
    expected = f"/memfd:{_MEMFD_PREFIX}{location.name} (deleted)"
    try:
        target = os.readlink(location.shm_path)
        # A node's disk tier file is mapped as it is: unpopulated, pages come from the cache.
        disk = os.path.basename(target) == DISK_FILE_NAME
        if start is None or (target != expected and not disk):
            raise TransferError(
                f"segment {location.name}: {location.shm_path} is {target!r}, not {expected!r}"
            )
        fd = os.open(location.shm_path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise TransferError(
            f"segment {location.name}: cannot open {location.shm_path}: {exc}"
        ) from exc
    try:
        st = os.fstat(fd)
        actual = st.st_size
        if actual != location.size:
            raise TransferError(
                f"segment {location.name}: {location.shm_path} has {actual} bytes, "
                f"the location says {location.size}"
            )
        mapping = SharedMapping(
            fd, location.size, f"peer segment {location.name}", populate=not disk
        )
    except OSError as exc:
        raise TransferError(f"segment {location.name}: cannot map: {exc}") from exc
    finally:
        # The mapping keeps the memory; the fd is not needed past mmap().
        os.close(fd)
    if process_start_time(pid) != start:
        mapping.close()
        raise TransferError(f"segment {location.name}: owner pid {pid} changed while mapping")
    return PeerMapping(location, mapping, pid, start, (st.st_dev, st.st_ino))
