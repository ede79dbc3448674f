"""The leader's side of replication: its operation log kept for the standbys, and the acks.

An HA leader's `OpLog` hands every flush (whole framed records, `oplog.py`) to
`ReplicationSource.append`. The bytes get a *position*: bytes of the stream since this
leader's term began. Standbys pull:

* `FollowLog(term, position)`: answered at once with the records from `position` (at most
  `ha_chunk_bytes`), or after up to `wait_ms` when there are none yet (a long poll). Asking
  position P acknowledges everything before P. A position outside the buffer, or another term,
  answers `snapshot_needed`.
* `FetchSnapshot(term, offset)`: offset 0 notes the stream's end P0 and starts walking the
  state (`durable.state_records`), sent `ha_chunk_bytes` at a time across loop turns; the
  standby applies it, then follows the log from P0. The records set state, so the fuzzy walk
  followed by the log from P0 converges (every change made during the walk is in that log).

A standby is *in sync* from its first `FollowLog` within `ha_chunk_bytes` of the stream's end
(before that it catches up without holding writes back) until it is silent for
`ha_standby_timeout` (then the leader goes on alone and logs it). A write's reply waits
(`wait`) until every standby in sync has acknowledged the position of the request's last
record; many requests wait on one ack (group commit). The buffer keeps what the slowest
registered standby has not acknowledged, bounded by `ha_buffer_bytes`: a standby further
behind is dropped and bootstraps again.

Runs on the master's event loop; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from kvpool.errors import ErrorCode, NotLeader
from kvpool.master.config import MasterConfig
from kvpool.master.oplog import Rec, encode_frames
from kvpool.protocol.messages import FetchSnapshot, FollowLog, LogReply, SnapshotReply

__all__ = ["ReplicationSource"]

log = logging.getLogger(__name__)

_MAX_WAIT_S = 2.0


@dataclass(slots=True)
class _Standby:
    member_id: str
    acked: int
    seen: float
    in_sync: bool = False
    snapshot: Iterator[Rec] | None = None
    sent: int = 0


class ReplicationSource:
    """The replication stream of one leader term (see the module docstring)."""

    def __init__(
        self,
        term: int,
        config: MasterConfig,
        *,
        records: Callable[[], Iterator[Rec]],
        flush: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.term = term
        self._records = records
        self._flush = flush
        self._clock = clock
        self._timeout = config.ha_standby_timeout
        self._limit = config.ha_buffer_bytes
        self._chunk = config.ha_chunk_bytes
        self._starts: list[int] = []
        self._chunks: list[bytes] = []
        self._head = 0  # first live chunk
        self._base = 0  # position of the first live chunk's first byte
        self._end = 0
        self._standbys: dict[str, _Standby] = {}
        self._in_sync = 0
        #: Standbys dropped from the in-sync set whose drop is not yet recorded in etcd
        #: (`published`): until it is, writes still wait for their acks as if they were in sync
        #: (position they had reached), so a member that etcd still names as in sync never
        #: misses an acknowledged write.
        self._held: dict[str, int] = {}
        self._acked = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._more: asyncio.Future[None] | None = None
        self._closed: str | None = None
        #: Counters for status and measurement.
        self.acks = 0
        self.dropped = 0

    # ------------------------------------------------------------------ the stream

    @property
    def end(self) -> int:
        """Position just past the last record flushed."""
        return self._end

    @property
    def acked(self) -> int:
        """Everything before this position is on every standby in sync (or none is)."""
        return self._acked if self._in_sync or self._held else self._end

    def published(self, members: frozenset[str]) -> None:
        """etcd now records `members` as this term's standbys in sync: a dropped standby not
        among them stops holding back the acks."""
        for member in [m for m in self._held if m not in members]:
            del self._held[member]
        self._settle()

    def held(self) -> list[str]:
        """Dropped standbys whose drop is not in etcd yet (writes still wait on them)."""
        return sorted(self._held)

    def in_sync(self) -> list[str]:
        return sorted(s.member_id for s in self._standbys.values() if s.in_sync)

    def append(self, data: bytes) -> None:
        """The bytes of one flush (the OpLog's tap)."""
        if self._closed is not None or not data:
            return
        self._starts.append(self._end)
        self._chunks.append(data)
        self._end += len(data)
        if not self._standbys:
            self._trim(self._end)
        elif self._end - self._base > self._limit:
            self._settle()  # drops the standby that holds the buffer past its bound
        more = self._more
        if more is not None:
            self._more = None
            if not more.done():
                more.set_result(None)

    def wait(self, position: int) -> asyncio.Future[None] | None:
        """None when `position` needs no wait (acknowledged, or no standby in sync); else a
        future done once it is (NotLeader LEADER_CHANGED when the term ends first)."""
        if self._closed is not None:
            raise NotLeader(self._closed, ErrorCode.LEADER_CHANGED)
        if not (self._in_sync or self._held) or position <= self._acked:
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((position, fut))
        return fut

    # ------------------------------------------------------------------ standby requests

    def follow(self, req: FollowLog) -> LogReply | Awaitable[LogReply]:
        """The reply at once when records past the position exist (or it is refused), else
        an awaitable of it (the long poll). The ack takes effect before either."""
        if self._closed is not None:
            raise NotLeader(self._closed)
        now = self._clock()
        pos = req.position
        if req.term != self.term or not self._valid(pos):
            self._forget(req.member_id, "asked for a position this term's buffer lacks")
            return LogReply(0, self.term, pos, b"", snapshot_needed=True)
        s = self._standbys.get(req.member_id)
        if s is None:
            s = self._standbys[req.member_id] = _Standby(req.member_id, pos, now)
        s.seen = now
        s.snapshot = None
        if pos > s.acked or not s.in_sync:
            s.acked = pos
        if not s.in_sync and self._end - pos <= self._chunk:
            # In sync once it is within one reply of the end: a standby still catching up on a
            # long log would make every write wait for all of it.
            s.in_sync = True
            self._in_sync += 1
            self._held.pop(req.member_id, None)  # tracked by its own acks again
            log.info(
                "standby %s in sync at position %d of term %d: writes now wait for it",
                req.member_id,
                pos,
                self.term,
            )
        self._settle()
        if pos >= self._end and req.wait_ms > 0:
            return self._poll(s, pos, req.wait_ms)
        return LogReply(0, self.term, pos, self._read(pos))

    async def _poll(self, s: _Standby, pos: int, wait_ms: int) -> LogReply:
        # Records may have come between the request and this task's first step.
        if pos >= self._end and self._closed is None:
            more = self._more
            if more is None or more.done():
                more = self._more = asyncio.get_running_loop().create_future()
            # One future for every poller (no task per poll): woken by `append` or the timer.
            timer = asyncio.get_running_loop().call_later(
                min(wait_ms / 1000, _MAX_WAIT_S), _wake, more
            )
            try:
                await asyncio.shield(more)
            finally:
                timer.cancel()
        if self._closed is not None:
            raise NotLeader(self._closed)
        s.seen = self._clock()
        if not self._valid(pos):  # dropped (too far behind) while it waited
            return LogReply(0, self.term, pos, b"", snapshot_needed=True)
        return LogReply(0, self.term, pos, self._read(pos))

    def fetch_snapshot(self, req: FetchSnapshot) -> SnapshotReply:
        if self._closed is not None:
            raise NotLeader(self._closed)
        now = self._clock()
        s = self._standbys.get(req.member_id)
        if req.offset == 0:
            self._flush()  # every record so far is in the stream, before P0
            if s is not None and s.in_sync:
                self._in_sync -= 1
                self._held[req.member_id] = s.acked  # until etcd no longer names it
            s = self._standbys[req.member_id] = _Standby(req.member_id, self._end, now)
            s.snapshot = self._records()
            log.info(
                "standby %s bootstraps from a snapshot at position %d of term %d",
                req.member_id,
                self._end,
                self.term,
            )
            self._settle()
        elif s is None or s.snapshot is None or s.sent != req.offset:
            return SnapshotReply(int(ErrorCode.INVALID_PARAMS), self.term, 0, req.offset)
        s.seen = now
        assert s.snapshot is not None
        data, done = encode_frames(s.snapshot, self._chunk)
        offset = s.sent
        s.sent += len(data)
        if done:
            s.snapshot = None
        return SnapshotReply(0, self.term, s.acked, offset, data, done)

    # ------------------------------------------------------------------ housekeeping

    def tick(self) -> None:
        """Forget standbys silent for `ha_standby_timeout` (writes stop waiting for them)."""
        now = self._clock()
        for s in list(self._standbys.values()):
            if now - s.seen > self._timeout:
                self._forget(s.member_id, f"silent for {now - s.seen:.1f} s")

    def close(self, reason: str) -> None:
        """The term ended: every waiting write answers LEADER_CHANGED. Idempotent."""
        if self._closed is not None:
            return
        self._closed = reason
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(NotLeader(reason, ErrorCode.LEADER_CHANGED))
        if self._more is not None and not self._more.done():
            self._more.set_result(None)
        self._chunks.clear()
        self._starts.clear()
        self._standbys.clear()
        self._in_sync = 0

    # ------------------------------------------------------------------ inside

    def _valid(self, pos: int) -> bool:
        if pos == self._end:
            return True
        if pos < self._base or pos > self._end:
            return False
        i = bisect.bisect_left(self._starts, pos, self._head)
        return i < len(self._starts) and self._starts[i] == pos

    def _read(self, pos: int) -> bytes:
        if pos >= self._end:
            return b""
        i = bisect.bisect_left(self._starts, pos, self._head)
        out = [self._chunks[i]]
        size = len(out[0])
        i += 1
        while i < len(self._chunks) and size < self._chunk:
            out.append(self._chunks[i])
            size += len(self._chunks[i])
            i += 1
        return out[0] if len(out) == 1 else b"".join(out)

    def _forget(self, member_id: str, why: str) -> None:
        s = self._standbys.pop(member_id, None)
        if s is None:
            return
        if s.in_sync:
            self._in_sync -= 1
            self._held[member_id] = s.acked
            log.warning(
                "standby %s dropped (%s)%s",
                member_id,
                why,
                "" if self._in_sync else ": no standby in sync, the leader acknowledges alone",
            )
        self._settle()

    def _settle(self) -> None:
        """Recompute the acknowledged position, release the writes it covers, trim."""
        standbys = self._standbys.values()
        synced = [s.acked for s in standbys if s.in_sync]
        synced += self._held.values()
        self._acked = min(synced) if synced else self._end
        acked = self._acked
        waiters = self._waiters
        while waiters and waiters[0][0] <= acked:
            _, fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self.acks += 1
        low = min((s.acked for s in standbys), default=self._end)
        if self._end - low > self._limit:
            # The slowest would keep more than the bound: drop it, it bootstraps again.
            slow = min(standbys, key=lambda s: s.acked)
            self.dropped += 1
            self._forget(slow.member_id, f"{self._end - slow.acked} bytes behind")
            return
        self._trim(low)

    def _trim(self, low: int) -> None:
        starts, chunks = self._starts, self._chunks
        head = self._head
        while head < len(starts) and starts[head] + len(chunks[head]) <= low:
            chunks[head] = b""
            head += 1
        self._head = head
        self._base = starts[head] if head < len(starts) else self._end
        if head > 1024 and head * 2 > len(starts):
            del starts[:head], chunks[:head]
            self._head = 0


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
