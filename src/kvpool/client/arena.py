"""`Arenas`: the Store's side of puts in one master round trip.

The master lends this client an arena (`ReserveArena`: a range of one segment); the Store cuts
each value's range from it here (bump allocation, aligned as the master says), writes the
value, and creates the object with one `PutCommit` (see `kvpool.master.arenas` for the rules).
A put therefore costs the write plus one round trip instead of two; a `ReserveArena` is paid
once per arena (every `size` bytes of puts), and it carries the ids of arenas this Store has
finished with (`retire`), so releasing them costs nothing extra.

Safety rules (a range the master has let go of may belong to another object at once):

* **Lease.** An arena is only cut from for `lease_ms / 2` after the sending of the last request
  the master answered for it (the ReserveArena, or a commit naming it: `confirm`). Past that the
  Store asks for a new arena. The master keeps what it lets go of unasked reserved until a
  write started within the lease must have ended, so no write lands on another's range.
* **Heartbeat.** A failed Ping or a NEED_REMOUNT (the master restarted, or expired this
  client) gives every arena up at once (`on_heartbeat(False)`); an OK Ping releases an idle,
  expired arena and whatever waits in the retire list (`on_heartbeat(True)`).
* **In flight.** An arena is released only when no put is between `take` and `done` on it; a
  replaced arena with puts in flight is parked in `_draining` and released once they are done.

When the master refuses an arena (no room: the pool is full and puts need PutStart's direct
reclaim; too many arenas; NOT_SUPPORTED: arenas are off) the Store uses PutStart/PutEnd: for
`_BACKOFF_S` after no room, for good after NOT_SUPPORTED. A commit answered INVALID_WRITE (the
master no longer knows the arena) `drop`s it. Values that need more than half of the largest
arena the master grants go straight to PutStart, without disturbing the current arena.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final, Protocol

from kvpool.errors import ErrorCode, KVPoolError
from kvpool.protocol.messages import (
    ArenaReply,
    ClientId,
    ReleaseArenas,
    ReserveArena,
    SegmentName,
)
from kvpool.rpc.client import RpcClient

__all__ = ["Arena", "Arenas"]


class HasRpc(Protocol):
    """Whatever holds the Store's master connection (`NodeRuntime`)."""

    rpc: RpcClient


log = logging.getLogger(__name__)

_BACKOFF_S: Final = 1.0
"""After the master had no room for an arena, puts use PutStart (which can reclaim) this long
before asking again."""


class Arena:
    """One arena lent by the master; `next` is where the next value's range starts."""

    __slots__ = ("arena_id", "end", "endpoint", "half_lease", "next", "segment", "users", "valid")

    def __init__(self, reply: ArenaReply, sent: float) -> None:
        self.arena_id = reply.arena_id
        self.segment = SegmentName(reply.segment)
        self.endpoint = reply.endpoint
        self.next = reply.offset
        self.end = reply.offset + reply.size
        self.half_lease = reply.lease_ms / 2000.0
        #: No range is cut after this (monotonic): half the lease after the last confirmation.
        self.valid = sent + self.half_lease
        self.users = 0  # puts between take and done


class Arenas:
    """This Store's arenas (see the module docstring). Thread-safe."""

    def __init__(self, node: HasRpc, client_id: ClientId, size: int) -> None:
        self._node = node  # its current client: a reconnect replaces it
        self._client_id = client_id
        self.size = size
        #: What an arena holds: `size`, or less once the master granted less (its caps, a
        #: fragmented pool). Values above a quarter of it and takes above half of it use
        #: PutStart/PutEnd.
        self._limit = size
        self._align = 64
        self._lock = threading.Lock()
        self._current: Arena | None = None
        self._draining: dict[int, Arena] = {}
        self._retire: list[int] = []
        self._retry_at = 0.0
        self._disabled = size <= 0

    @property
    def max_value(self) -> int:
        """Values larger than this take PutStart/PutEnd (an arena holds at least four)."""
        return self._limit // 4

    def take(self, sizes: list[int]) -> tuple[Arena, list[int]] | None:
        """Ranges for values of `sizes` (one arena, consecutive), or None: use PutStart.
        A non-None answer must be followed by exactly one `done(arena)`."""
        with self._lock:
            if self._disabled:  # arenas off, refused for good, or closed
                return None
            mask = self._align - 1
            offs: list[int] = []
            need = 0
            for s in sizes:
                offs.append(need)
                need += (s + mask) & ~mask
            if need > self._limit // 2:
                return None
            arena = self._current
            if arena is None or arena.next + need > arena.end or time.monotonic() >= arena.valid:
                arena = self._renew(need)
                if arena is None:
                    return None
                if self._align - 1 != mask:
                    return None  # the master aligns otherwise (learnt just now): next time
            base = arena.next
            arena.next = base + need
            arena.users += 1
            return arena, [base + o for o in offs]

    def confirm(self, arena: Arena, sent: float) -> None:
        """The master answered a request naming `arena` that was sent at `sent` (monotonic):
        it renewed the lease from then."""
        until = sent + arena.half_lease
        arena.valid = max(arena.valid, until)

    def done(self, arena: Arena) -> None:
        """A put that `take`-n ranges of `arena` has finished (committed or failed)."""
        with self._lock:
            arena.users -= 1
            if arena.users == 0 and self._draining.pop(arena.arena_id, None) is not None:
                self._retire.append(arena.arena_id)

    def abandon(self, arena: Arena) -> None:
        """Hand out nothing more from `arena` (a write into it failed: its node may be going
        away) and release it once its puts are done."""
        with self._lock:
            if self._current is arena:
                self._current = None
                self._park(arena)

    def drop(self, arena: Arena) -> None:
        """The master does not know `arena` any more: stop using it (nothing to release)."""
        with self._lock:
            if self._current is arena:
                self._current = None
            self._draining.pop(arena.arena_id, None)

    def on_heartbeat(self, ok: bool) -> None:
        """The node's heartbeat listener (see the module docstring). Never waits: while a put
        holds the lock for a ReserveArena round trip, this beat is skipped (the next one acts;
        a put's own lease check does not depend on it)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            arena = self._current
            if arena is not None and (not ok or time.monotonic() >= arena.valid):
                self._current = None
                self._park(arena)
            ids = self._retire if ok else []
            if ids:
                self._retire = []
        finally:
            self._lock.release()
        if ids:
            self._release(ids)

    def close(self) -> None:
        """Release every arena no put is writing into (best effort). Arenas still in use are
        left to the master, which releases them once their lease and the write bound pass."""
        with self._lock:
            self._disabled = True
            if self._current is not None:
                self._park(self._current)
                self._current = None
            ids, self._retire = self._retire, []
        if ids:
            self._release(ids)

    def _park(self, arena: Arena) -> None:
        """Release `arena` once no put uses it (lock held)."""
        if arena.users:
            self._draining[arena.arena_id] = arena
        else:
            self._retire.append(arena.arena_id)

    def _release(self, ids: list[int]) -> None:
        try:
            self._node.rpc.call(ReleaseArenas(self._client_id, ids))
        except KVPoolError as exc:
            log.debug("ReleaseArenas of %d arena(s) failed: %s", len(ids), exc)

    def _renew(self, need: int) -> Arena | None:
        """Replace the current arena by a new one of at least `need` bytes (lock held)."""
        now = time.monotonic()
        if now < self._retry_at:
            return None
        old = self._current
        self._current = None
        if old is not None:
            self._park(old)
        retire = self._retire
        self._retire = []
        try:
            reply = self._node.rpc.call_as(
                ReserveArena(self._client_id, self.size, need, retire), ArenaReply
            )
        except BaseException as exc:
            self._retire = retire + self._retire  # not released: try again next time
            self._retry_at = now + _BACKOFF_S
            if not isinstance(exc, KVPoolError):
                raise
            log.debug("ReserveArena failed: %s", exc)
            return None
        if reply.code == ErrorCode.OK:
            self._align = reply.alignment
            self._limit = min(self.size, reply.size)
            self._current = Arena(reply, now)
            return self._current
        if reply.code == ErrorCode.NOT_SUPPORTED:
            self._disabled = True
        elif reply.code == ErrorCode.INVALID_PARAMS:
            self._retire = retire + self._retire  # refused before the retire list was read
            self._disabled = True
            log.warning("the master refused ReserveArena as invalid; arenas are off")
        else:
            self._retry_at = now + _BACKOFF_S
        return None
