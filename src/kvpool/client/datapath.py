"""`DataPath`: how the Store moves bytes, and where segments are.

The Store's data plane in one object: the `TransferEngine`, a cache of segment locations (asked
of the master once per segment with `GetSegment`, forgotten after a failed transfer so that a
remounted or restarted owner is found again), and two same-host fast paths that use the engine's
mappings directly:

* in a batch, requests on segments mapped here (this process's own, or a same-host peer's memfd)
  are copied in the calling thread under one `hold_segment` of the mapping, and each value is
  hashed right after its copy, while it is still in the CPU cache;
* a single large value on a mapped segment is copied and hashed in `HASH_CHUNK` pieces; from
  `SHARED_MIN` on, a helper thread copies some of the pieces meanwhile (see `_Share`).

Everything else (TCP, single small requests) goes through the engine's `transfer` / `submit`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import xxhash

from kvpool.client.node import NodeRuntime
from kvpool.codes import OBJECT_NOT_FOUND
from kvpool.errors import ErrorCode, KVPoolError, TransferError, error_for_code, raise_for_code
from kvpool.protocol.messages import (
    GetSegment,
    LocationsReply,
    SegmentInfo,
    SegmentName,
    SegmentReply,
)
from kvpool.transfer.copy import BOUNCE_MAX, copy_and_hash, slow_distance
from kvpool.transfer.engine import RouteKind, SegmentHold, TransferEngine
from kvpool.transfer.location import SegmentLocation
from kvpool.transfer.native import copy_xxh3
from kvpool.transfer.registration import buffer_address
from kvpool.transfer.request import TransferOp, TransferRequest

__all__ = [
    "CHUNKED_MIN",
    "HASH_CHUNK",
    "LONG_CHUNK",
    "SHARED_MIN",
    "SHARE_PIECE",
    "DataPath",
    "chunk_for",
]

log = logging.getLogger(__name__)

_PENDING: Final = ErrorCode.INTERNAL_ERROR
_OK: Final = ErrorCode.OK
_READ: Final = TransferOp.READ
"""Module constants: `Enum.MEMBER` costs an EnumType attribute lookup per read on Python 3.11."""
_NOT_FOUND: Final = int(OBJECT_NOT_FOUND)
"""Placeholder code of a request handed to the engine (replaced by the engine's code)."""
HASH_CHUNK: Final = 256 << 10
"""Large values on mapped segments are copied and hashed in chunks of this size, in one
thread: each chunk is hashed while it is still in the CPU cache, which is faster than copying
the whole value and hashing it after. Overlapping the hash with a copy in the engine's copy
thread instead was slower: waking another thread costs more than the whole hash
(docs/parts/perf-store.md)."""
CHUNKED_MIN: Final = 4 * HASH_CHUNK
"""Single values at least this large take the chunked copy-and-hash path."""
LONG_CHUNK: Final = 1 << 20
"""The chunk used instead of HASH_CHUNK when the destination lies just past the source modulo
a page (see `chunk_for`): copies this large take glibc's vector loop, not `rep movsb`."""
SHARE_PIECE: Final = max(1 << 20, BOUNCE_MAX)
"""The piece each thread claims at a time in a shared copy (see `_Share`): at least the L2
size, so glibc copies every piece with its vector loop whatever the distance (`chunk_for`);
larger pieces measured no faster."""
SHARED_MIN: Final = 4 * SHARE_PIECE
"""Single values at least this large are copied by the caller and a helper thread together;
smaller ones by the caller alone, in HASH_CHUNK pieces."""
_EXPLORE: Final = 8
"""Every this many large copies, the way that measured slower recently is timed again."""
_SAMPLES: Final = 5
"""Recent timings kept per way; their median is what the ways are compared by."""
_STALLS: Final = 2
"""The helper stops once the caller has made no progress during this many of its pieces."""
STREAM_PUTS: Final = 1
"""A put's fused copy (`kvpool.transfer.native`) writes the segment with non-temporal stores:
this process does not read those bytes again, and skipping the read of each destination line
makes the copy faster than a memcpy (docs/parts/perf-store.md). 0: cached stores."""
_memmove: Final = ctypes.memmove  # releases the GIL, so that the other thread can claim


def _location(info: SegmentInfo) -> SegmentLocation:
    """Where a segment the master described lives, as the transfer engine needs it."""
    return SegmentLocation(info.name, info.size, info.host_id, info.endpoint, info.shm_path)


def chunk_for(dst_addr: int, src_addr: int) -> int:
    """The copy-and-hash chunk for a copy from `src_addr` to `dst_addr`.

    glibc copies sizes from ~2 KiB up to the L2 size with `rep movsb`, which on AMD runs
    several times slower when the destination starts less than 64 bytes past the source
    modulo 4 KiB (glibc avoids that case only on Intel; docs/parts/perf-store.md). Exactly
    that happens on every get into a numpy array or a large bytearray (malloc'd at page + 16)
    from a page-aligned replica. Chunks of at least LONG_CHUNK take the vector loop at full
    speed and are still hashed from L2/L3.
    """
    if slow_distance(dst_addr, src_addr):
        return LONG_CHUNK
    return HASH_CHUNK


@dataclass(slots=True, eq=False)
class _Share:
    """One large copy of `n` bytes from address `src` to `dst`, shared by two threads.

    Both threads claim SHARE_PIECE pieces in order from the front; the helper thread only
    copies its pieces, the caller copies its own and hashes every piece in order (xxh3 runs
    in order and in one thread), each as soon as it has been copied: one core does not reach
    the machine's copy bandwidth, and the hash of one piece runs while the other thread copies
    the next: with a free core this beats copying and hashing alone, and even a plain memcpy
    (docs/parts/perf-store.md, "a copy helper thread").
    Nothing is handed over and the caller waits only when the next piece to hash is the one
    the helper is still copying; a helper that starts late (its core busy) finds less left to
    claim, or nothing.

    A helper with no core of its own takes turns with the caller instead (with a CPU-bound
    process on the other core it copied nearly every piece while the caller waited to run,
    slower than the caller alone). So the helper stops once the caller has made no progress
    during _STALLS of its pieces, and the caller does most of that copy itself.

    A claim takes SHARE_PIECE bytes, or everything left when less than two pieces are, so no
    piece is shorter than SHARE_PIECE (or the whole copy) and none falls into glibc's slow
    `rep movsb` range. Fields are guarded by `lock`."""

    dst: int
    src: int
    n: int
    claimed: int = 0
    """[0, claimed) has been claimed."""
    copied: dict[int, int] = field(default_factory=dict)
    """Pieces (start: end) copied but not hashed yet."""
    lost: dict[int, int] = field(default_factory=dict)
    """Pieces the helper failed to copy (the caller copies them itself)."""
    helping: bool = False
    """The helper is copying a piece it claimed."""
    progress: int = 0
    """Pieces the caller has copied or hashed (it alone writes this; the helper reads it)."""
    waiter: threading.Lock | None = None
    """Held while the caller waits for the helper's piece; the helper releases it."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _claim(self) -> tuple[int, int] | None:
        c, n = self.claimed, self.n
        if c >= n:
            return None
        e = n if n - c < 2 * SHARE_PIECE else c + SHARE_PIECE
        self.claimed = e
        return c, e

    def help(self) -> None:
        """The helper's part: copy pieces until none is left to claim."""
        lock = self.lock
        seen = stalled = -1
        while True:
            with lock:
                if self.progress == seen:
                    stalled += 1
                    if stalled >= _STALLS:  # the caller is not running: leave the CPU to it
                        return
                else:
                    seen, stalled = self.progress, 0
                piece = self._claim()
                if piece is None:
                    return
                self.helping = True
            c, e = piece
            ok = False
            try:
                _memmove(self.dst + c, self.src + c, e - c)
                ok = True
            finally:
                self.helped(c, e, ok)

    def helped(self, start: int, end: int, ok: bool) -> None:
        """The helper is done with its piece (`ok`: copied); wakes the caller if it waits."""
        with self.lock:
            (self.copied if ok else self.lost)[start] = end
            self.helping = False
            if self.waiter is not None:
                self.waiter.release()
                self.waiter = None

    def copy_hashing(self, view: memoryview, update: Callable[[memoryview], None]) -> None:
        """The caller's part: copy pieces, and hash `view` (the caller's buffer: the source of
        a write, the destination of a read) in order as its pieces are copied."""
        lock, dst, src, n = self.lock, self.dst, self.src, self.n
        step = chunk_for(dst, src)
        hashed = 0
        while hashed < n:
            waiter = None
            with lock:
                end = self.copied.pop(hashed, 0)
                piece = None
                if not end:
                    redo = self.lost.pop(hashed, 0)
                    piece = (hashed, redo) if redo else self._claim()
                    if piece is None:  # the helper is copying the piece at `hashed`
                        waiter = self.waiter = threading.Lock()
                        waiter.acquire()
            if waiter is not None:
                waiter.acquire()
                continue
            if piece is not None:
                c, end = piece
                if c != hashed:  # the helper is still copying an earlier piece
                    _memmove(dst + c, src + c, end - c)
                    self.progress += 1
                    with lock:
                        self.copied[c] = end
                    continue
                # The next to hash: copy and hash it in chunks, each hashed from L2 (as when
                # the caller copies alone; whole 1 MiB pieces were hashed from L3, slower).
                while c < end:
                    e = end if end - c < 2 * step else c + step
                    _memmove(dst + c, src + c, e - c)
                    update(view[c:e])
                    self.progress += 1
                    c = e
                hashed = end
                continue
            update(view[hashed:end])
            self.progress += 1
            hashed = end

    def settle(self) -> None:
        """Let the helper claim nothing more and wait for the piece it is copying, if any:
        once the caller returns (an exception included) nothing may write into the segment
        or the caller's buffer."""
        with self.lock:
            self.claimed = self.n
            if not self.helping:
                return
            waiter = self.waiter = threading.Lock()
            waiter.acquire()
        interrupted: BaseException | None = None
        while True:  # an interrupt must not let the caller leave while the helper writes
            try:
                waiter.acquire()
                break
            except BaseException as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted


class _CopyHelper:
    """The helper thread of shared copies (see `_Share`), started on first use, and whether
    to use it. Thread-safe."""

    def __init__(self) -> None:
        self._shares: queue.SimpleQueue[_Share | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()  # of the process the thread runs in
        # One CPU: a second thread could only take turns with the caller.
        self._closed = len(os.sched_getaffinity(0)) < 2
        # Recent seconds per byte of large copies by (read, shared): reads and writes differ.
        self._timings: dict[tuple[bool, bool], deque[float]] = {
            (read, shared): deque(maxlen=_SAMPLES)
            for read in (False, True)
            for shared in (False, True)
        }
        self._copies = 0

    def wanted(self, read: bool) -> bool:
        """Whether the next large copy should be shared: the way that was faster lately.

        Whether a helper pays depends on what else the machine runs, and it changes: on an
        idle machine shared copies are clearly faster, but while other processes keep every
        core busy they are slower than the caller alone. So both ways are timed as they run, the median of their recent timings decides, and every _EXPLORE-th
        copy takes the other way to keep its timing current. Unsynchronised between callers:
        a hint, harmless when stale."""
        if self._closed:
            return False
        self._copies += 1
        shared, alone = self._timings[read, True], self._timings[read, False]
        if len(shared) < 2 or len(alone) < 2:  # learn both first
            return len(shared) <= len(alone)
        faster = statistics.median(shared) <= statistics.median(alone)
        return faster != (self._copies % _EXPLORE == 0)

    def timed(self, read: bool, shared: bool, seconds: float, nbytes: int) -> None:
        """A large copy (`read`: from a segment) of `nbytes` took `seconds`, `shared` or by
        the caller alone."""
        self._timings[read, shared].append(seconds / nbytes)

    def offer(self, share: _Share) -> bool:
        """Let the helper take pieces of `share`; False when there is no helper (closed)."""
        with self._lock:
            if self._closed:
                return False
            if self._thread is not None and self._pid != os.getpid():
                # A forked child: the parent's thread is not here, nor its queue's consumer.
                self._thread, self._shares = None, queue.SimpleQueue()
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="kvpool-copy-helper", daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # no thread to be had: the caller copies alone
                    log.warning("no copy helper thread (%s): large copies run alone", exc)
                    self._closed = True
                    return False
                self._thread, self._pid = thread, os.getpid()
            self._shares.put(share)
        return True

    def close(self) -> None:
        """Stop the thread once the shares offered are done (idempotent)."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            if thread is not None:
                self._shares.put(None)
        if thread is not None and self._pid == os.getpid():  # a fork's child has no thread
            thread.join()

    def _run(self) -> None:
        shares = self._shares
        while True:
            share = shares.get()
            if share is None:
                return
            try:
                share.help()
            except Exception:  # the piece is in share.lost: the caller copies it
                log.exception("copy helper: a copy failed; the caller makes it itself")
            share = None  # do not keep the caller's buffers while waiting


class _Resolve:
    """One `GetSegment` in flight for a segment name, and the threads waiting for its answer.
    `forgotten` is set (under `DataPath._loc_lock`) by a `forget` of the name meanwhile."""

    __slots__ = ("_done", "error", "forgotten", "location")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.location: SegmentLocation | None = None
        self.error: KVPoolError | None = None
        self.forgotten = False

    def settle(self, location: SegmentLocation | None) -> None:
        """The answer (None: the asking thread was interrupted; a waiter asks again)."""
        self.location = location
        self._done.set()

    def fail(self, error: KVPoolError) -> None:
        # An untraced copy: the raised one's traceback holds the asking frame, which holds
        # this record (a cycle that a process freezing its heap would never free).
        self.error = error_for_code(error.code, error.message)
        self._done.set()

    def wait(self) -> SegmentLocation | None:
        """The answer, once the asking thread has it; raises the master's refusal or the
        fault of the call (as an exception of its own, of the same code)."""
        self._done.wait()  # bounded: the asking thread's RPC has a timeout
        if self.error is not None:
            raise error_for_code(self.error.code, self.error.message) from self.error
        return self.location


class DataPath:
    """The data plane of one Store (see the module docstring). Thread-safe."""

    def __init__(
        self,
        node: NodeRuntime,
        protocol: Literal["auto", "shm", "tcp"],
        transfer_timeout: float,
    ) -> None:
        self._node = node
        self.protocol = protocol
        self.transfer_timeout = transfer_timeout
        self._locations: dict[str, SegmentLocation] = {}
        self._resolving: dict[str, _Resolve] = {}
        """Names being asked of the master now, each by one thread (see `resolve`)."""
        self._loc_lock = threading.Lock()  # guards both dicts
        self.engine = TransferEngine(
            self.resolve,
            protocol=protocol,
            data_key=lambda: node.rpc.data_key,
            tls=node.tls_client,
        )
        self._helper = _CopyHelper()

    def close(self) -> None:
        """Let go of peer mappings, sockets and threads (idempotent)."""
        self._helper.close()
        self.engine.close()

    def resolve(self, name: str) -> SegmentLocation:
        """The engine's resolver: where segment `name` lives (cached; asks the master once).

        A miss is resolved by one thread at a time: the others that miss the same name meanwhile
        wait for its answer (or its error) instead of asking too. A `forget` of the name while
        the master is being asked wins: the answer goes to the callers waiting for it, but is not
        cached, since it may be what the failure that called `forget` found stale."""
        loc = self._locations.get(name)
        if loc is not None:
            return loc
        while True:
            with self._loc_lock:
                loc = self._locations.get(name)
                if loc is not None:
                    return loc
                pending = self._resolving.get(name)
                mine = pending is None
                if pending is None:
                    pending = self._resolving[name] = _Resolve()
            if mine:
                return self._ask(name, pending)
            got = pending.wait()
            if got is not None:
                return got
            # The resolving thread was interrupted by something other than the master's
            # answer (KeyboardInterrupt, a bug): this thread asks itself.

    def _ask(self, name: str, pending: _Resolve) -> SegmentLocation:
        """Ask the master where `name` is, for every thread waiting on `pending`."""
        try:
            reply = self._node.rpc.call_as(GetSegment(SegmentName(name)), SegmentReply)
            raise_for_code(reply.code, f"segment {name!r}")
            info = reply.segment
            if info is None:
                raise error_for_code(ErrorCode.SEGMENT_NOT_FOUND, f"segment {name!r}")
            loc = _location(info)
        except KVPoolError as exc:
            with self._loc_lock:
                del self._resolving[name]
            pending.fail(exc)
            raise
        except BaseException:
            with self._loc_lock:
                del self._resolving[name]
            pending.settle(None)
            raise
        with self._loc_lock:
            del self._resolving[name]
            if not pending.forgotten:
                self._locations[name] = loc
        pending.settle(loc)
        return loc

    def learn(self, infos: Sequence[SegmentInfo]) -> None:
        """Remember where segments are (a replica task names its segments), sparing the
        `GetSegment` round trips of `resolve`."""
        with self._loc_lock:
            for info in infos:
                if info.name not in self._locations:
                    self._locations[info.name] = _location(info)

    def forget(self, name: str) -> None:
        """Drop what we know of a segment after a failed transfer (it may have been remounted
        elsewhere or its owner died); the next use asks the master again."""
        with self._loc_lock:
            self._locations.pop(name, None)
            pending = self._resolving.get(name)
            if pending is not None:
                pending.forgotten = True  # what it finds is not cached (see `resolve`)
        self.engine.forget(name)

    def is_local(self, segment: SegmentName) -> bool:
        """Whether `segment` lives on this host (False when it cannot be resolved)."""
        try:
            return self.resolve(segment).host_id == self._node.host_id
        except KVPoolError:
            return False

    def transfer(self, reqs: list[TransferRequest]) -> list[ErrorCode]:
        """Run `reqs` through the engine (buffers are byte memoryviews); one code per request.

        One request runs in this thread (no hand-off to a copy thread, which costs more than a
        small copy); more go to the engine as one batch. A failed segment is forgotten."""
        if not reqs:
            return []
        engine = self.engine
        if len(reqs) == 1:
            try:
                engine.transfer(reqs, self.transfer_timeout)
                return [ErrorCode.OK]
            except TransferError as exc:
                sent = [exc.code]
        else:
            sent = engine.submit(reqs, self.transfer_timeout).result(self.transfer_timeout)
        for req, code in zip(reqs, sent, strict=True):
            if code != ErrorCode.OK:
                log.debug(
                    "transfer %s %s@%d failed: %s", req.op.name, req.segment, req.offset, code
                )
                self.forget(req.segment)
        return sent

    def write_hashing(
        self, view: memoryview, segment: str, offset: int
    ) -> tuple[ErrorCode, int | None]:
        """Write `view` to `offset` of `segment` through the engine (one request); returns its
        code and the xxh3_64 of `view` when it could be taken while a TCP write waited for the
        node's answer (None otherwise: the caller hashes it itself). A failed segment is
        forgotten, as by `transfer`."""
        digest: list[int] = []

        def meanwhile() -> None:
            if not digest:  # once, even when a stale pooled connection is retried
                digest.append(xxhash.xxh3_64_intdigest(view))

        try:
            self.engine.transfer(
                [TransferRequest(TransferOp.WRITE, view, segment, offset)],
                self.transfer_timeout,
                meanwhile,
            )
        except TransferError as exc:
            log.debug("transfer WRITE %s@%d failed: %s", segment, offset, exc.code)
            self.forget(segment)
            return exc.code, None
        return ErrorCode.OK, digest[0] if digest else None

    def move_many(
        self,
        op: TransferOp,
        views: list[memoryview],
        segments: list[str],
        offsets: list[int],
        want: list[bool] | bool,
    ) -> tuple[list[ErrorCode], list[int | None]]:
        """Move `views[i]` to (WRITE) or from (READ) `offsets[i]` of `segments[i]`; returns one
        code per place and, where `want` (all, or `want[i]`), the xxh3_64 of the value when it
        could be taken right after its copy (None otherwise: the caller hashes it itself).

        Places on segments this process can map (its own, or a same-host peer's) are copied
        right here while holding the mapping, and hashed while the value is still in the CPU
        cache; the rest go to the engine as one batch. The lists are parallel (no request
        objects): this runs once per key of every batch.
        """
        n = len(views)
        codes: list[ErrorCode] = [_PENDING] * n
        digests: list[int | None] = [None] * n
        if n == 0:
            return codes, digests
        rest: list[int] = list(range(n))
        if self.protocol != "tcp":  # one request too: cheaper here than via the engine
            first = segments[0]
            if segments.count(first) == n:  # the common case: one segment, one hold
                if self._copy_mapped(
                    op, views, offsets, want, codes=codes, digests=digests, segment=first, idxs=None
                ):
                    return codes, digests
            else:
                groups: dict[str, list[int]] = {}
                for i, seg in enumerate(segments):
                    groups.setdefault(seg, []).append(i)
                rest = []
                for seg, idxs in groups.items():
                    if not self._copy_mapped(
                        op,
                        views,
                        offsets,
                        want,
                        codes=codes,
                        digests=digests,
                        segment=seg,
                        idxs=idxs,
                    ):
                        rest += idxs
        if rest:
            sent = self.transfer(
                [TransferRequest(op, views[i], segments[i], offsets[i]) for i in rest]
            )
            for i, code in zip(rest, sent, strict=True):
                codes[i] = code
        return codes, digests

    def read_mapped(
        self, dest: memoryview, segment: str, offset: int, want: bool
    ) -> tuple[ErrorCode, int | None] | None:
        """`move_many` of one READ in its common case, in one call: `segment`'s route is known
        and mapped here (`TransferEngine.held_mapping`); returns the code and, with `want`, the
        xxh3_64 taken while the value is in the cache. None when that is not the case: the
        caller takes the general path (which resolves, maps, checks the owner or uses TCP)."""
        mapping = self.engine.held_mapping(segment)
        if mapping is None:
            return None
        try:
            mem = mapping.view
            end = offset + dest.nbytes
            if offset < 0 or end > mem.nbytes:
                return ErrorCode.INVALID_PARAMS, None  # never copy outside the segment
            dest[:] = mem[offset:end]
            return ErrorCode.OK, xxhash.xxh3_64_intdigest(dest) if want else None
        finally:
            mapping.release()

    def read_batch_mapped(
        self, loc: LocationsReply, views: list[memoryview], verify: bool
    ) -> list[int] | None:
        """A strict `batch_get_into` in its common case, under one acquire of one mapping: every
        key found (one replica each, all on the one segment of `loc`, which is mapped here) or
        missing, every value fits its view; each value is copied and, with `verify`, hashed
        while in the cache. Per key its size, or OBJECT_NOT_FOUND's value. None as soon as
        anything is off that case (another code, a bad place, a view too small, a checksum
        that does not match): the caller's general path then does the whole batch again and
        says which key failed and why. The caller checks the lease."""
        if len(loc.segments) != 1 or self.protocol == "tcp":
            return None
        mapping = self.engine.held_mapping(loc.segments[0])
        if mapping is None:
            return None
        digest = xxhash.xxh3_64_intdigest
        sums, sizes, places = loc.checksums, loc.sizes, loc.places
        out: list[int] = []
        try:
            mem = mapping.view
            cap = mem.nbytes
            for i, code in enumerate(loc.codes):
                if code:
                    if code != _NOT_FOUND:
                        return None
                    out.append(code)
                    continue
                p = places[i]
                if len(p) != 2 or p[0] != 0:
                    return None
                off, size, view = p[1], sizes[i], views[i]
                end = off + size
                if off < 0 or end > cap or size > view.nbytes:
                    return None
                dest = view if view.nbytes == size else view[:size]
                dest[:] = mem[off:end]
                want = sums[i]
                if verify and want is not None and digest(dest) != want:
                    return None
                out.append(size)
        finally:
            mapping.release()
        return out

    def over_tcp(self, segment: str) -> bool:
        """Whether transfers with `segment` go over TCP (TCP forced, or not mapped here): a
        round trip each, which the hot cache (`kvpool.client.hotcache`) saves."""
        if self.protocol == "tcp":
            return True
        try:
            return self.engine.route_kind(segment) is RouteKind.TCP
        except KVPoolError:
            return True

    def hold_mapped(self, segment: str) -> SegmentHold | None:
        """A hold on `segment`'s mapping when it is mapped here (this process's own, or a
        same-host peer's shared memory) and TCP is not forced; None otherwise. Use it as a
        context manager: the mapping stays valid until it exits."""
        if self.protocol == "tcp":
            return None
        engine = self.engine
        try:
            if engine.route_kind(segment) is RouteKind.TCP:
                return None
            return engine.hold_segment(segment)
        except KVPoolError:
            return None

    def _copy_mapped(
        self,
        op: TransferOp,
        views: list[memoryview],
        offsets: list[int],
        want: list[bool] | bool,
        *,
        codes: list[ErrorCode],
        digests: list[int | None],
        segment: str,
        idxs: list[int] | None,
    ) -> bool:
        """Copy the places `idxs` (None: all) on `segment` in this thread if it is mapped here
        (LOCAL or SHM route), filling `codes` and `digests`; False when it is not mapped.

        Why not always the engine: its per-request bookkeeping (request object, future,
        routing, completion) costs more than a small copy itself; a batch of small reads
        copied here under one hold is several times faster than through `submit`
        (docs/parts/client.md).
        """
        # A route known and mapped: acquire its mapping in one call; else the general hold
        # (which resolves, maps, checks the owner) or False.
        mapping = self.engine.held_mapping(segment) if self.protocol != "tcp" else None
        hold = self.hold_mapped(segment) if mapping is None else None
        if mapping is None and hold is None:
            return False
        ok = ErrorCode.OK
        bad = ErrorCode.INVALID_PARAMS
        digest = xxhash.xxh3_64_intdigest
        every = want is True
        wants = want if isinstance(want, list) else None
        read = op is TransferOp.READ
        try:
            mem = mapping.view if mapping is not None else hold.buffer  # type: ignore[union-attr]
            size = mem.nbytes
            for i in range(len(views)) if idxs is None else idxs:
                view = views[i]
                o = offsets[i]
                e = o + view.nbytes
                if o < 0 or e > size:
                    codes[i] = bad  # never copy outside the segment
                    continue
                if read:
                    view[:] = mem[o:e]
                else:
                    mem[o:e] = view
                codes[i] = ok
                if every or (wants is not None and wants[i]):
                    digests[i] = digest(view)  # still in the cache
        finally:
            if mapping is not None:
                mapping.release()
            elif hold is not None:
                hold.release()
        return True

    def copy_hashing(
        self, op: TransferOp, view: memoryview, segment: str, offset: int
    ) -> tuple[ErrorCode, int] | None:
        """Copy `view` to or from a segment mapped here, hashing it as it goes; returns (code,
        xxh3_64 of the value), or None when the segment is not mapped here (the caller then
        uses the engine and hashes separately). One native pass when the fused copy is built
        (`kvpool.transfer.native`), else in chunks hashed while in the cache (HASH_CHUNK);
        values of SHARED_MIN and more may be copied with the helper thread (`_Share`)."""
        # A route known and mapped: its mapping in one call; else the general hold.
        mapping = self.engine.held_mapping(segment) if self.protocol != "tcp" else None
        hold = self.hold_mapped(segment) if mapping is None else None
        if mapping is None and hold is None:
            return None
        n = view.nbytes
        try:
            mem = mapping.view if mapping is not None else hold.buffer  # type: ignore[union-attr]
            base = mapping.address if mapping is not None else hold.address  # type: ignore[union-attr]
            if offset < 0 or offset + n > mem.nbytes:
                return ErrorCode.INVALID_PARAMS, 0  # never copy outside the segment
            here, there = buffer_address(view), base + offset
            read, large = op is _READ, n >= SHARED_MIN
            if large and self._helper.wanted(read):
                hasher = xxhash.xxh3_64()
                if read:
                    self._copy_shared(read, view, _Share(here, there, n), hasher)
                else:
                    self._copy_shared(read, view, _Share(there, here, n), hasher)
                return _OK, hasher.intdigest()
            started = time.perf_counter()
            if copy_xxh3 is not None:  # the hash hides under the copy's memory stalls
                if read:
                    digest = copy_xxh3(here, there, n, 0)
                else:
                    digest = copy_xxh3(there, here, n, STREAM_PUTS)
            else:
                step = chunk_for(here, there) if read else chunk_for(there, here)
                digest = copy_and_hash(read, view, mem, offset, step)
        finally:
            if mapping is not None:
                mapping.release()
            else:
                hold.release()  # type: ignore[union-attr]
        if large:
            self._helper.timed(read, False, time.perf_counter() - started, n)
        return _OK, digest

    def _copy_shared(
        self, read: bool, view: memoryview, share: _Share, hasher: xxhash.xxh3_64
    ) -> None:
        """Copy `share` with the helper thread's help, hashing `view` (see `_Share`)."""
        helper = self._helper
        started = time.perf_counter()
        offered = False
        try:
            offered = helper.offer(share)  # without a helper the caller claims every piece
            share.copy_hashing(view, hasher.update)
        finally:
            share.settle()
        if offered:
            helper.timed(read, True, time.perf_counter() - started, share.n)
