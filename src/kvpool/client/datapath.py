"""`DataPath`: how the Store moves bytes, and where segments are.

The Store's data plane in one object: the `TransferEngine`, a cache of segment locations (asked
of the master once per segment with `GetSegment`, forgotten after a failed transfer so that a
remounted or restarted owner is found again), and two same-host fast paths that use the engine's
mappings directly:

* in a batch, requests on segments mapped here (this process's own, or a same-host peer's memfd)
  are copied in the calling thread under one `hold_segment` of the mapping, and each value is
  hashed right after its copy, while it is still in the CPU cache;
* a single large value on a mapped segment is copied and hashed in `HASH_CHUNK` pieces.

Everything else (TCP, single small requests) goes through the engine's `transfer` / `submit`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Final, Literal

import xxhash

from kvpool.client.node import NodeRuntime
from kvpool.errors import ErrorCode, KVPoolError, TransferError, error_for_code, raise_for_code
from kvpool.protocol.messages import GetSegment, SegmentInfo, SegmentName, SegmentReply
from kvpool.transfer.engine import RouteKind, TransferEngine
from kvpool.transfer.location import SegmentLocation
from kvpool.transfer.registration import buffer_address
from kvpool.transfer.request import TransferOp, TransferRequest

__all__ = ["CHUNKED_MIN", "HASH_CHUNK", "LONG_CHUNK", "DataPath", "chunk_for"]

log = logging.getLogger(__name__)

_PENDING: Final = ErrorCode.INTERNAL_ERROR
"""Placeholder code of a request handed to the engine (replaced by the engine's code)."""
HASH_CHUNK: Final = 256 << 10
"""Large values on mapped segments are copied and hashed in chunks of this size, in one
thread: each chunk is hashed while it is still in the CPU cache (16 MiB copy + xxh3 measured
1.31 ms chunked against 1.69 ms whole). Overlapping the hash with a copy in the engine's copy
thread instead was measured 5x slower on this loaded 2-core machine: waking another thread costs
more than the whole hash."""
CHUNKED_MIN: Final = 4 * HASH_CHUNK
"""Single values at least this large take the chunked copy-and-hash path."""
LONG_CHUNK: Final = 1 << 20
"""The chunk used instead of HASH_CHUNK when the destination lies just past the source modulo
a page (see `chunk_for`): copies this large take glibc's vector loop, not `rep movsb`."""
_SHORT_DISTANCE: Final = 64


def chunk_for(dst_addr: int, src_addr: int) -> int:
    """The copy-and-hash chunk for a copy from `src_addr` to `dst_addr`.

    glibc copies sizes from ~2 KiB up to the L2 size (512 KiB on this AMD EPYC) with
    `rep movsb`, which runs 5-15x slower when the destination starts less than 64 bytes past
    the source modulo 4 KiB (glibc avoids that case only on Intel). Exactly that happens on
    every get into a numpy array or a large bytearray (malloc'd at page + 16) from a
    page-aligned replica: 256 KiB chunks then copied 1 MiB in 357 us against 61 us. Chunks of
    at least LONG_CHUNK take the vector loop at full speed and are still hashed from L2/L3.
    """
    if (dst_addr - src_addr) & 4095 < _SHORT_DISTANCE:
        return LONG_CHUNK
    return HASH_CHUNK


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
        self._loc_lock = threading.Lock()
        self.engine = TransferEngine(self.resolve, protocol=protocol)

    def close(self) -> None:
        """Let go of peer mappings, sockets and threads (idempotent)."""
        self.engine.close()

    def resolve(self, name: str) -> SegmentLocation:
        """The engine's resolver: where segment `name` lives (cached; asks the master once)."""
        loc = self._locations.get(name)
        if loc is not None:
            return loc
        reply = self._node.rpc.call_as(GetSegment(SegmentName(name)), SegmentReply)
        raise_for_code(reply.code, f"segment {name!r}")
        info = reply.segment
        if info is None:
            raise error_for_code(ErrorCode.SEGMENT_NOT_FOUND, f"segment {name!r}")
        loc = SegmentLocation(info.name, info.size, info.host_id, info.endpoint, info.shm_path)
        with self._loc_lock:
            self._locations[name] = loc
        return loc

    def learn(self, infos: Sequence[SegmentInfo]) -> None:
        """Remember where segments are (a replica task names its segments), sparing the
        `GetSegment` round trips of `resolve`."""
        with self._loc_lock:
            for info in infos:
                if info.name not in self._locations:
                    self._locations[info.name] = SegmentLocation(
                        info.name, info.size, info.host_id, info.endpoint, info.shm_path
                    )

    def forget(self, name: str) -> None:
        """Drop what we know of a segment after a failed transfer (it may have been remounted
        elsewhere or its owner died); the next use asks the master again."""
        with self._loc_lock:
            self._locations.pop(name, None)
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
        if n > 1 and self.protocol != "tcp":  # one request: the engine is as quick
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
        routing, completion) costs ~5-15 us, which is most of a 4 KiB copy; a batch of 64
        small reads measured 0.6-0.9 ms through `submit` against 0.07-0.18 ms copied here
        under one hold.
        """
        engine = self.engine
        try:
            if engine.route_kind(segment) is RouteKind.TCP:
                return False
            hold = engine.hold_segment(segment)
        except KVPoolError:
            return False
        ok = ErrorCode.OK
        bad = ErrorCode.INVALID_PARAMS
        digest = xxhash.xxh3_64_intdigest
        every = want is True
        wants = want if isinstance(want, list) else None
        read = op is TransferOp.READ
        with hold:
            mem = hold.buffer
            size = mem.nbytes
            for i in range(len(views)) if idxs is None else idxs:
                view = views[i]
                o = offsets[i]
                e = o + view.nbytes
                if e > size:
                    codes[i] = bad  # never copy outside the segment
                    continue
                if read:
                    view[:] = mem[o:e]
                else:
                    mem[o:e] = view
                codes[i] = ok
                if every or (wants is not None and wants[i]):
                    digests[i] = digest(view)  # still in the cache
        return True

    def copy_hashing(
        self, op: TransferOp, view: memoryview, segment: str, offset: int
    ) -> tuple[ErrorCode, int] | None:
        """Copy `view` to or from a segment mapped here, hashing it chunk by chunk as it goes
        (see HASH_CHUNK); returns (code, xxh3_64 of the value), or None when the segment is
        not mapped here (the caller then uses the engine and hashes separately)."""
        if self.protocol == "tcp":
            return None
        engine = self.engine
        try:
            if engine.route_kind(segment) is RouteKind.TCP:
                return None
            hold = engine.hold_segment(segment)
        except KVPoolError:
            return None
        n = view.nbytes
        hasher = xxhash.xxh3_64()
        with hold:
            mem = hold.buffer
            if offset + n > mem.nbytes:
                return ErrorCode.INVALID_PARAMS, 0  # never copy outside the segment
            here, there = buffer_address(view), hold.address + offset
            step = chunk_for(here, there) if op is TransferOp.READ else chunk_for(there, here)
            c = 0
            while c < n:
                # No short last chunk: it could fall back into glibc's slow range.
                e = n if n - c < 2 * step else c + step
                # Copy first, then hash the chunk while it is in the cache (either side of
                # the copy has it): 2.06 ms for a 16 MiB write against 2.40 hashing first.
                if op is TransferOp.READ:
                    view[c:e] = mem[offset + c : offset + e]
                else:
                    mem[offset + c : offset + e] = view[c:e]
                hasher.update(view[c:e])
                c = e
        return ErrorCode.OK, hasher.intdigest()
