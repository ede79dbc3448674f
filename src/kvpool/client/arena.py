"""`Arenas`: the Store's side of puts in one master round trip.

The master lends this client an arena (`ReserveArena`: a range of one segment); the Store cuts
each value's range from it here (bump allocation, aligned as the master says), writes the
value, and creates the object with one `PutCommit` (see `kvpool.master.arenas` for the rules).
A put therefore costs the write plus one round trip instead of two; a `ReserveArena` is paid
once per arena (every `size` bytes of puts), and it carries the ids of arenas this Store has
finished with (`retire`), so releasing them costs nothing extra.

Safety rule: an arena is released only when no put is between `take` and `done` on it (a
released range may be handed to another writer at once, so a put still writing there would
scribble over someone else's object). A replaced arena with puts in flight is parked in
`_draining` and released by the next ReserveArena (or `close`) once they are done.

When the master refuses an arena (no room: the pool is full and its puts need PutStart's
direct reclaim; NOT_SUPPORTED: arenas are off) the Store uses PutStart/PutEnd: for
`_BACKOFF_S` after no room, for good after NOT_SUPPORTED. A commit answered INVALID_WRITE (the
master no longer knows the arena: it restarted, the segment went away) `drop`s the arena.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

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

log = logging.getLogger(__name__)

_BACKOFF_S: Final = 1.0
"""After the master had no room for an arena, puts use PutStart (which can reclaim) this long
before asking again."""


class Arena:
    """One arena lent by the master; `next` is where the next value's range starts."""

    __slots__ = ("arena_id", "end", "endpoint", "next", "segment", "users")

    def __init__(self, reply: ArenaReply) -> None:
        self.arena_id = reply.arena_id
        self.segment = SegmentName(reply.segment)
        self.endpoint = reply.endpoint
        self.next = reply.offset
        self.end = reply.offset + reply.size
        self.users = 0  # puts between take and done


class Arenas:
    """This Store's arenas (see the module docstring). Thread-safe."""

    def __init__(self, rpc: RpcClient, client_id: ClientId, size: int) -> None:
        self._rpc = rpc
        self._client_id = client_id
        self.size = size
        #: Values larger than this take PutStart/PutEnd (an arena holds at least four).
        self.max_value = size // 4
        self._align = 64
        self._lock = threading.Lock()
        self._current: Arena | None = None
        self._draining: dict[int, Arena] = {}
        self._retire: list[int] = []
        self._retry_at = 0.0
        self._disabled = size <= 0

    def take(self, sizes: list[int]) -> tuple[Arena, list[int]] | None:
        """Ranges for values of `sizes` (one arena, consecutive), or None: use PutStart.
        A non-None answer must be followed by exactly one `done(arena)`."""
        if self._disabled:
            return None
        with self._lock:
            mask = self._align - 1
            offs: list[int] = []
            need = 0
            for s in sizes:
                offs.append(need)
                need += (s + mask) & ~mask
            if need > self.size // 2:
                return None
            arena = self._current
            if arena is None or arena.next + need > arena.end:
                arena = self._renew(need)
                if arena is None:
                    return None
                if self._align - 1 != mask:
                    return None  # the master aligns otherwise (learnt just now): next time
            base = arena.next
            arena.next = base + need
            arena.users += 1
            return arena, [base + o for o in offs]

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
                if arena.users:
                    self._draining[arena.arena_id] = arena
                else:
                    self._retire.append(arena.arena_id)

    def drop(self, arena: Arena) -> None:
        """The master does not know `arena` any more: stop using it (nothing to release)."""
        with self._lock:
            if self._current is arena:
                self._current = None
            self._draining.pop(arena.arena_id, None)

    def close(self) -> None:
        """Release every arena (best effort: if the master cannot be reached, it parks them
        when this client expires)."""
        with self._lock:
            self._disabled = True
            ids = list(self._retire)
            self._retire.clear()
            for a in (self._current, *self._draining.values()):
                if a is not None:
                    ids.append(a.arena_id)
            self._current = None
            self._draining.clear()
        if ids:
            try:
                self._rpc.call(ReleaseArenas(self._client_id, ids))
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
            if old.users:
                self._draining[old.arena_id] = old
            else:
                self._retire.append(old.arena_id)
        retire = self._retire
        self._retire = []
        try:
            reply = self._rpc.call_as(
                ReserveArena(self._client_id, self.size, need, retire), ArenaReply
            )
        except KVPoolError as exc:
            self._retire = retire + self._retire  # not released: try again next time
            self._retry_at = now + _BACKOFF_S
            log.debug("ReserveArena failed: %s", exc)
            return None
        if reply.code == ErrorCode.OK:
            self._align = reply.alignment
            self._current = Arena(reply)
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
