"""A node's disk tier: one preallocated file the pool allocates in, and a journal of what it holds.

Layout of an offload directory (docs/parts/tiers.md has the measurements behind it):

* `kvpool-disk.data`: `size` bytes reserved up front with `posix_fallocate` (the tier can never
  grow past it, nor fail for want of space half-way through a write). The node maps it as a
  segment of kind LOCAL_DISK, unpopulated, and the master allocates object ranges in it as in a
  memory segment; bytes arrive through the ordinary replica tasks (the node is their executor)
  and leave through the same engine and transfer server as memory.
* `kvpool-disk.journal`: append-only records `[u32 length][u64 xxh3 of payload][payload]`,
  the payload a msgpack array `[op, offset, size, checksum, tenant, key]` (op 1: the object is
  at `offset`; 2: that range was given up). A record is appended only after the object's bytes
  were flushed to the file (msync) and the journal is fdatasync'ed before the task is reported
  done, so an object the master was told about is on disk whole. A torn last record (a crash
  while appending) fails its hash and ends the journal there.
* `kvpool-disk.lock`: an exclusive `flock`, so two nodes never share one directory.

Opening replays the journal (a later record over an overlapping range replaces the older one:
the master reuses a range only after freeing it), reads every remaining object back and checks
it against its checksum: what fails (a file truncated or corrupted while the node was down, a
write torn by a crash) is refused and counted, never registered. The journal is then rewritten
with the survivors (temp file, fsync, rename). `entries()` is what the node registers with the
master (`RegisterDiskReplicas`) after mounting the file, and again whenever the master forgot
its segment.

While mounted, a background thread (`check_interval`; one per tier, stopped by `close()`)
checks the tier as the master's DFS check checks files: each round it re-reads up to
`check_per_round` objects (at most `check_bytes_per_round` bytes), round robin, through a file
descriptor opened at mount (the same file as the mapping), and looks at the data file's path:
an object whose bytes no longer match its checksum (corrupted on disk), or every object once
the file was deleted or replaced under the running node (nothing of it survives the next
start), is reported to the master (`ReportBadReplica`: the disk replica is dropped when the
object has another readable one; the last one is kept, never served wrong) and journaled as
given up. Counted in `DiskTierStats.check_bad` / `file_vanished`.

A file of another size than asked starts the tier afresh (the journal is discarded). `close()`
unmaps nothing itself (the node's segment owns the mapping) and releases the lock; the files
stay for the next start, `wipe()` removes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec
import xxhash

from kvpool.client.node import NodeRuntime
from kvpool.config import parse_size
from kvpool.errors import InvalidParams, KVPoolError, raise_for_code
from kvpool.protocol.messages import (
    CountReply,
    DiskEntry,
    RegisterDiskReplicas,
    ReplicaKind,
    ReplicaTask,
    Reply,
    ReportBadReplica,
    SegmentName,
    TenantId,
)
from kvpool.transfer.memory import DISK_FILE_NAME, SegmentMemory

__all__ = ["DATA_FILE", "JOURNAL_FILE", "DiskTier", "DiskTierSet", "DiskTierStats"]

log = logging.getLogger(__name__)

DATA_FILE: Final = DISK_FILE_NAME
JOURNAL_FILE: Final = "kvpool-disk.journal"
LOCK_FILE: Final = "kvpool-disk.lock"
_HEAD: Final = struct.Struct("<IQ")
_ADD: Final = 1
_DEL: Final = 2
_MAX_RECORD: Final = 1 << 20
_VERIFY_CHUNK: Final = 8 << 20
_REGISTER_CHUNK: Final = 4096
CHECK_INTERVAL_S: Final = 1.0
"""Seconds between two rounds of the background check (0: no check)."""
CHECK_PER_ROUND: Final = 64
"""Objects re-read per round at most."""
CHECK_BYTES_PER_ROUND: Final = 64 << 20
"""Bytes re-read per round at most (one larger object is still read whole, alone)."""


@dataclass(slots=True)
class DiskTierStats:
    """What a disk tier did (tests, status lines)."""

    loaded: int = 0
    """Objects the journal named at open."""
    verified: int = 0
    """Of those, read back whole (checksum matched)."""
    refused: int = 0
    """Of those, refused: truncated, corrupt or torn."""
    written: int = 0
    """Objects journaled since open."""
    torn_records: int = 0
    """Journal bytes cut off at open (a torn last record)."""
    checked: int = 0
    """Objects the background check re-read."""
    check_bad: int = 0
    """Objects it found corrupt or lost (reported to the master, journaled as given up)."""
    file_vanished: bool = False
    """The data file was deleted or replaced under the running node."""


class DiskTier:
    """The disk tier in `directory` of `size` bytes (module docstring). Thread-safe."""

    def __init__(
        self,
        directory: str,
        size: int | str,
        *,
        check_interval: float = CHECK_INTERVAL_S,
        check_per_round: int = CHECK_PER_ROUND,
        check_bytes_per_round: int = CHECK_BYTES_PER_ROUND,
    ) -> None:
        nbytes = parse_size(size, name="offload_size", minimum=1 << 20)
        if not 0 <= check_interval <= 3600 or check_per_round < 1 or check_bytes_per_round < 1:
            raise InvalidParams(
                f"disk check: interval {check_interval!r} (0-3600 s), per round "
                f"{check_per_round!r} and bytes per round {check_bytes_per_round!r} (>= 1)"
            )
        self.directory = os.path.abspath(directory)
        self.size = nbytes
        self.stats = DiskTierStats()
        self._lock = threading.Lock()
        self._entries: dict[int, DiskEntry] = {}
        self._check_interval = check_interval
        self._check_per_round = check_per_round
        self._check_bytes = check_bytes_per_round
        self._scan: list[int] = []
        self._check_fd = -1
        self._check_ino: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._checker: threading.Thread | None = None
        self.segment: SegmentMemory | None = None
        """The mounted data file (set by the node after mounting it)."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            self._lock_fd = os.open(
                os.path.join(self.directory, LOCK_FILE),
                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                0o600,
            )
        except OSError as exc:
            raise InvalidParams(f"offload dir {directory!r}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            raise InvalidParams(f"offload dir {directory!r} is in use by another process") from exc
        self._journal_fd = -1
        try:
            self._open_data()
            self._load()
        except BaseException:
            self.close()
            raise

    @property
    def data_path(self) -> str:
        return os.path.join(self.directory, DATA_FILE)

    @property
    def journal_path(self) -> str:
        return os.path.join(self.directory, JOURNAL_FILE)

    # ------------------------------------------------------------------ open

    def _open_data(self) -> None:
        path = self.data_path
        fresh = False
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise InvalidParams(f"cannot open {path!r}: {exc.strerror or exc}") from exc
        try:
            st = os.fstat(fd)
            if st.st_size != self.size:
                fresh = st.st_size != 0
                os.ftruncate(fd, 0)
                try:
                    os.posix_fallocate(fd, 0, self.size)
                except OSError as exc:
                    os.ftruncate(fd, 0)
                    raise InvalidParams(
                        f"offload dir {self.directory!r}: cannot reserve {self.size} bytes: "
                        f"{exc.strerror or exc}"
                    ) from exc
                with contextlib.suppress(OSError):
                    os.unlink(self.journal_path)
        finally:
            os.close(fd)
        if fresh:
            log.warning("disk tier %s: size changed, starting empty", self.directory)

    def _load(self) -> None:
        path = self.journal_path
        entries: dict[int, DiskEntry] = {}
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        pos, n = 0, len(data)
        while pos + _HEAD.size <= n:
            length, digest = _HEAD.unpack_from(data, pos)
            end = pos + _HEAD.size + length
            if length > _MAX_RECORD or end > n:
                break
            payload = data[pos + _HEAD.size : end]
            if xxhash.xxh3_64_intdigest(payload) != digest:
                break
            try:
                op, offset, size, csum, tenant, key = msgspec.msgpack.decode(payload)
            except (msgspec.DecodeError, ValueError, TypeError):
                break
            if op == _ADD:
                for off in [
                    o for o, e in entries.items() if o < offset + size and offset < o + e.size
                ]:
                    del entries[off]
                entries[offset] = DiskEntry(TenantId(tenant), key, offset, size, csum)
            elif op == _DEL:
                entries.pop(offset, None)
            pos = end
        self.stats.torn_records = n - pos
        self.stats.loaded = len(entries)
        good = self._verify(entries)
        self.stats.verified = len(good)
        self.stats.refused = len(entries) - len(good)
        if self.stats.refused:
            log.warning(
                "disk tier %s: %d object(s) failed verification and are dropped",
                self.directory,
                self.stats.refused,
            )
        self._entries = good
        self._rewrite()

    def _verify(self, entries: dict[int, DiskEntry]) -> dict[int, DiskEntry]:
        good: dict[int, DiskEntry] = {}
        fd = os.open(self.data_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for off in sorted(entries):
                e = entries[off]
                if e.offset + e.size > self.size:
                    continue
                h = xxhash.xxh3_64()
                pos, left = e.offset, e.size
                ok = True
                while left:
                    chunk = os.pread(fd, min(left, _VERIFY_CHUNK), pos)
                    if not chunk:
                        ok = False
                        break
                    h.update(chunk)
                    pos += len(chunk)
                    left -= len(chunk)
                if ok and h.intdigest() == e.checksum:
                    good[off] = e
        finally:
            os.close(fd)
        return good

    def _rewrite(self) -> None:
        tmp = self.journal_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(_record(_ADD, e) for e in self._entries.values()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.journal_path)
        self._fsync_dir()
        self._journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def _fsync_dir(self) -> None:
        dfd = os.open(self.directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # ------------------------------------------------------------------ use

    def entries(self) -> list[DiskEntry]:
        """The objects this tier holds (what the node registers with the master)."""
        with self._lock:
            return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def on_task_written(self, task: ReplicaTask) -> None:
        """The task executor wrote `task`'s bytes: journal every target on this tier's
        segment, after flushing them to the file. Raises `KVPoolError` when that fails (the
        task then fails and the master frees the range)."""
        seg = self.segment
        if seg is None:
            return
        mine = [t for t in task.targets if t.segment == seg.name]
        if not mine:
            return
        view = seg.buffer
        records: list[bytes] = []
        new: list[DiskEntry] = []
        for t in mine:
            if t.offset + task.size > seg.size:
                raise KVPoolError(f"disk target {t.offset}+{task.size} is outside {seg.name}")
            part = view[t.offset : t.offset + task.size]
            try:
                csum = task.checksum
                if csum is None:
                    csum = int(xxhash.xxh3_64_intdigest(part))
            finally:
                part.release()
            e = DiskEntry(TenantId(task.tenant), task.key, t.offset, task.size, csum)
            seg.mapping.flush(t.offset, task.size)
            records.append(_record(_ADD, e))
            new.append(e)
        with self._lock:
            if self._journal_fd < 0:
                raise KVPoolError(f"disk tier {self.directory} is closed")
            try:
                os.write(self._journal_fd, b"".join(records))
                os.fdatasync(self._journal_fd)
            except OSError as exc:
                raise KVPoolError(f"disk tier journal: {exc.strerror or exc}") from exc
            for e in new:
                for off in [
                    o
                    for o, old in self._entries.items()
                    if o < e.offset + e.size and e.offset < o + old.size
                ]:
                    del self._entries[off]
                self._entries[e.offset] = e
            self.stats.written += len(new)

    def on_freed(self, ranges: list[tuple[SegmentName, int]]) -> None:
        """The master freed these ranges (Remove, overwrite, a promotion that replaced the
        disk copy...): journal them as given up, so that a restart does not bring their
        objects back. Best effort: a failure is logged (the range is superseded when it is
        written again)."""
        seg = self.segment
        if seg is None:
            return
        with self._lock:
            gone = [
                self._entries.pop(off)
                for name, off in ranges
                if name == seg.name and off in self._entries
            ]
            if not gone or self._journal_fd < 0:
                return
            try:
                os.write(self._journal_fd, b"".join(_record(_DEL, e) for e in gone))
                os.fdatasync(self._journal_fd)
            except OSError as exc:
                log.warning(
                    "disk tier %s: journaling %d freed range(s) failed: %s",
                    self.directory,
                    len(gone),
                    exc,
                )

    def mount(
        self, node: NodeRuntime, on_created: Callable[[SegmentMemory], None] | None = None
    ) -> SegmentMemory:
        """Mount the data file into the pool as `node`'s LOCAL_DISK segment and register what
        it holds; registered again whenever the master forgot the segment (a remount that did
        not restore it)."""
        mem = node.mount(
            self.size, on_created=on_created, path=self.data_path, kind=ReplicaKind.LOCAL_DISK
        )
        self.segment = mem
        self.register(node)
        self._start_check(node)
        previous = node.on_remount

        def remounted(restored: list[SegmentName]) -> None:
            if previous is not None:
                previous(restored)
            if mem.name not in restored and not mem.closed:
                self.register(node)

        node.on_remount = remounted
        return mem

    def register(self, node: NodeRuntime) -> int:
        """Tell the master what this tier holds (`RegisterDiskReplicas`, in chunks); answers
        how many replicas it registered."""
        seg = self.segment
        if seg is None:
            return 0
        entries = self.entries()
        total = 0
        for i in range(0, len(entries), _REGISTER_CHUNK):
            msg = RegisterDiskReplicas(
                node.client_id, SegmentName(seg.name), entries[i : i + _REGISTER_CHUNK]
            )
            reply = node.rpc.call_as(msg, CountReply)
            raise_for_code(reply.code, "RegisterDiskReplicas")
            total += reply.count
        log.info(
            "disk tier %s: %d of %d object(s) registered with %s",
            self.directory,
            total,
            len(entries),
            node.master,
        )
        return total

    # ------------------------------------------------------------------ background check

    def _start_check(self, node: NodeRuntime) -> None:
        if self._check_interval <= 0 or self._checker is not None:
            return
        try:
            fd = os.open(self.data_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("disk tier %s: no background check: %s", self.directory, exc)
            return
        st = os.fstat(fd)
        with self._lock:
            self._check_fd = fd
            self._check_ino = (st.st_dev, st.st_ino)
        self._checker = threading.Thread(
            target=self._check_loop, args=(node,), name="kvpool-disk-check", daemon=True
        )
        self._checker.start()

    def _check_loop(self, node: NodeRuntime) -> None:
        while not self._stop.wait(self._check_interval):
            if node.closed:
                return
            try:
                bad = self.check()
                for e in bad:
                    self._report(node, e)
            except KVPoolError as exc:  # the master is away: the next round tries again
                log.debug("disk tier %s: check: %s", self.directory, exc)
            except Exception:  # a bug must not kill the node; logged, and the next round runs
                log.exception("disk tier %s: check failed", self.directory)

    def check(self) -> list[DiskEntry]:
        """One bounded round of the background check (module docstring): the objects found
        corrupt or lost, already taken out of the tier and journaled as given up."""
        vanished = self._file_vanished()
        with self._lock:
            if self._check_fd < 0:
                return []
            if not self._scan:
                self._scan = sorted(self._entries, reverse=True)
            todo: list[DiskEntry] = []
            budget = self._check_bytes
            while self._scan and len(todo) < self._check_per_round:
                e = self._entries.get(self._scan[-1])
                if e is not None and todo and e.size > budget:
                    break
                self._scan.pop()
                if e is not None:
                    todo.append(e)
                    budget -= e.size
            fd = self._check_fd
        bad = todo if vanished else [e for e in todo if not self._matches(fd, e)]
        self.stats.checked += len(todo)
        if not bad:
            return []
        with self._lock:
            gone = [e for e in bad if self._entries.get(e.offset) is e]  # not rewritten since
            for e in gone:
                del self._entries[e.offset]
            if gone and self._journal_fd >= 0:
                try:
                    os.write(self._journal_fd, b"".join(_record(_DEL, e) for e in gone))
                    os.fdatasync(self._journal_fd)
                except OSError as exc:
                    log.warning("disk tier %s: journaling a bad object: %s", self.directory, exc)
        self.stats.check_bad += len(gone)
        if gone:
            log.warning(
                "disk tier %s: %d object(s) %s; dropped",
                self.directory,
                len(gone),
                "lost with the data file" if vanished else "corrupt on disk",
            )
        return gone

    def _file_vanished(self) -> bool:
        if self.stats.file_vanished:
            return True
        try:
            st = os.stat(self.data_path)
            same = (st.st_dev, st.st_ino) == self._check_ino
        except OSError:
            same = False
        if not same:
            self.stats.file_vanished = True
            log.error(
                "disk tier %s: the data file was deleted or replaced; its objects are "
                "given up (what they hold elsewhere stays readable)",
                self.directory,
            )
        return not same

    @staticmethod
    def _matches(fd: int, e: DiskEntry) -> bool:
        h = xxhash.xxh3_64()
        pos, left = e.offset, e.size
        try:
            while left:
                chunk = os.pread(fd, min(left, _VERIFY_CHUNK), pos)
                if not chunk:
                    return False
                h.update(chunk)
                pos += len(chunk)
                left -= len(chunk)
        except OSError:
            return False
        return h.intdigest() == e.checksum

    def _report(self, node: NodeRuntime, e: DiskEntry) -> None:
        seg = self.segment
        if seg is None:
            return
        node.rpc.call_as(ReportBadReplica(e.key, SegmentName(seg.name), e.offset, e.tenant), Reply)

    def close(self) -> None:
        """Stop the background check, close the journal and release the directory's lock.
        Idempotent."""
        self._stop.set()
        checker = self._checker
        if checker is not None and checker is not threading.current_thread():
            checker.join(timeout=30)
        with self._lock:
            if self._check_fd >= 0:
                os.close(self._check_fd)
                self._check_fd = -1
            if self._journal_fd >= 0:
                os.close(self._journal_fd)
                self._journal_fd = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    def wipe(self) -> None:
        """Close, then delete the tier's files (its objects are gone for good)."""
        self.close()
        for name in (DATA_FILE, JOURNAL_FILE, JOURNAL_FILE + ".tmp", LOCK_FILE):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, name))


class DiskTierSet:
    """The disk tiers of one node (`kvpool node --offload-dir A --offload-dir B`: one file
    per directory, each its own LOCAL_DISK segment; the master spreads offloads over them by
    free space). The task executor's callbacks go to every tier, each keeping what names its
    own segment."""

    def __init__(self, tiers: list[DiskTier]) -> None:
        self.tiers = list(tiers)

    def on_task_written(self, task: ReplicaTask) -> None:
        for tier in self.tiers:
            tier.on_task_written(task)

    def on_freed(self, ranges: list[tuple[SegmentName, int]]) -> None:
        for tier in self.tiers:
            tier.on_freed(ranges)

    def close(self) -> None:
        """Close every tier (idempotent)."""
        for tier in self.tiers:
            tier.close()


def _record(op: int, e: DiskEntry) -> bytes:
    payload = msgspec.msgpack.encode([op, e.offset, e.size, e.checksum, e.tenant, e.key])
    return _HEAD.pack(len(payload), xxhash.xxh3_64_intdigest(payload)) + payload
