"""`DataPath`: how the Store moves bytes, and where segments are.

The Store's data plane in one object: the `TransferEngine`, a cache of segment locations (asked
of the master once per segment with `GetSegment`, forgotten after a failed transfer so that a
remounted or restarted owner is found again), and two same-host fast paths that use the engine's
mappings directly:

* in a batch, requests on segments mapped here (this process's own, or a same-host peer's memfd)
  are copied in the calling thread under one `hold_segment` of the mapping, and each value is
  hashed right after its copy, while it is still in the CPU cache;
* a value of 1 MiB or more on a mapped segment (and a batch put's of FUSED_MIN or more) is
  copied and hashed in one pass by the fused copy (`kvpool.transfer.native`), or in
  `HASH_CHUNK` pieces without it; from `SHARED_MIN` on, a helper thread may copy some of the
  pieces meanwhile (`kvpool.client.sharedcopy`).

Everything else (TCP, single small requests) goes through the engine's `transfer` / `submit`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Final, Literal

import xxhash

from kvpool.client.node import NodeRuntime
from kvpool.client.sharedcopy import CHUNKED_MIN, SHARED_MIN, CopyHelper, Share, chunk_for
from kvpool.codes import OBJECT_NOT_FOUND
from kvpool.errors import ErrorCode, KVPoolError, TransferError, error_for_code, raise_for_code
from kvpool.protocol.messages import (
    GetSegment,
    LocationsReply,
    SegmentInfo,
    SegmentName,
    SegmentReply,
)
from kvpool.transfer.copy import copy_and_hash
from kvpool.transfer.engine import RouteKind, SegmentHold, TransferEngine
from kvpool.transfer.location import SegmentLocation
from kvpool.transfer.native import copy_xxh3
from kvpool.transfer.registration import buffer_address
from kvpool.transfer.request import TransferOp, TransferRequest

__all__ = ["FUSED_MIN", "STREAM_PUTS", "DataPath"]

log = logging.getLogger(__name__)

_PENDING: Final = ErrorCode.INTERNAL_ERROR
"""Placeholder code of a request handed to the engine (replaced by the engine's code)."""
_NOT_FOUND: Final = int(OBJECT_NOT_FOUND)
_OK: Final = ErrorCode.OK
_READ: Final = TransferOp.READ
"""Module constants: `Enum.MEMBER` costs an EnumType attribute lookup per read on Python 3.11."""
FUSED_MIN: Final = 256 << 10
"""Values of a batch put at least this large are written with the fused copy (when it is
built; a batch get's from CHUNKED_MIN, as single values): below, its call costs about what it
saves, and a read of a value still in the cache is faster copied, then hashed (16 x 256 KiB
gets measured 10 % slower fused)."""
STREAM_PUTS: Final = 1
"""A put's fused copy (`kvpool.transfer.native`) writes the segment with non-temporal stores:
this process does not read those bytes again, and skipping the read of each destination line
makes the copy faster than a memcpy (docs/parts/perf-store.md). 0: cached stores."""


def _location(info: SegmentInfo) -> SegmentLocation:
    """Where a segment the master described lives, as the transfer engine needs it."""
    return SegmentLocation(info.name, info.size, info.host_id, info.endpoint, info.shm_path)


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
        self._helper = CopyHelper()

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
        digest, fused = xxhash.xxh3_64_intdigest, copy_xxh3
        sums, sizes, places = loc.checksums, loc.sizes, loc.places
        out: list[int] = []
        try:
            mem, base = mapping.view, mapping.address
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
                want = sums[i]
                if verify and want is not None and fused is not None and size >= CHUNKED_MIN:
                    if fused(buffer_address(dest), base + off, size, 0) != want:
                        return None
                    out.append(size)
                    continue
                dest[:] = mem[off:end]
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
        fused = copy_xxh3 if every or wants is not None else None
        try:
            mem = mapping.view if mapping is not None else hold.buffer  # type: ignore[union-attr]
            base = mapping.address if mapping is not None else hold.address  # type: ignore[union-attr]
            size = mem.nbytes
            for i in range(len(views)) if idxs is None else idxs:
                view = views[i]
                o = offsets[i]
                n = view.nbytes
                e = o + n
                if o < 0 or e > size:
                    codes[i] = bad  # never copy outside the segment
                    continue
                hashed = every or (wants is not None and wants[i])
                if fused is not None and n >= (CHUNKED_MIN if read else FUSED_MIN) and hashed:
                    here = buffer_address(view)
                    if read:
                        digests[i] = fused(here, base + o, n, 0)
                    else:
                        digests[i] = fused(base + o, here, n, STREAM_PUTS)
                    codes[i] = ok
                    continue
                if read:
                    view[:] = mem[o:e]
                else:
                    mem[o:e] = view
                codes[i] = ok
                if hashed:
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
        values of SHARED_MIN and more may be copied with the helper thread (`sharedcopy.Share`)."""
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
                    self._copy_shared(read, view, Share(here, there, n), hasher)
                else:
                    self._copy_shared(read, view, Share(there, here, n), hasher)
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
        self, read: bool, view: memoryview, share: Share, hasher: xxhash.xxh3_64
    ) -> None:
        """Copy `share` with the helper thread's help, hashing `view` (see `Share`)."""
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
