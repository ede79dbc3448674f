"""The arena table: every live arena, each client's arenas, and the ghosts of unmounted ones.

`arenas.py` tells what an arena is for and the rules of its lease. This module keeps the
arenas (`Arena`: owner, segment, range, deadline, the ranges committed from it) by id and by
client, and the *ghosts* of arenas whose segment was unmounted: (offset, size, reserved until)
by segment name, taken again if a segment of that name is mounted before then. Every range it
takes or lets go of goes through the core (`reserve_range`, `free_range`, `park_range`,
`take_range`); it is a `MetadataObserver` of the core, told of mounts, unmounts and expired
clients.
"""

from __future__ import annotations

import bisect
import logging
import random
from collections.abc import Callable

from kvpool.codes import NO_AVAILABLE_HANDLE, OK
from kvpool.master.core import MetadataCore, MetadataObserver
from kvpool.master.metadata import ObjectMeta
from kvpool.master.segments import Segment
from kvpool.override import override
from kvpool.protocol.messages import ClientId, SegmentName

__all__ = ["ARENA_LEASE_S", "MAX_ARENAS_PER_CLIENT", "Arena", "ArenaTable"]

log = logging.getLogger(__name__)

_ids = random.SystemRandom()

ARENA_LEASE_S = 2.0
"""Seconds an arena stays the client's after the last request naming it (at most client_ttl)."""
MAX_ARENAS_PER_CLIENT = 4
"""Arenas one client may hold at once (one it cuts from, a few finishing their writes)."""


class Arena:
    """A range of one segment lent to one client for its one-round-trip puts."""

    __slots__ = (
        "arena_id",
        "client_id",
        "deadline",
        "end",
        "ends",
        "segment",
        "start",
        "starts",
    )

    def __init__(
        self,
        arena_id: int,
        client_id: ClientId,
        segment: Segment,
        start: int,
        size: int,
        *,
        deadline: float,
    ) -> None:
        self.arena_id = arena_id
        self.client_id = client_id
        self.segment = segment
        self.start = start
        self.end = start + size
        #: No write into the arena starts after this (master clock); renewed by each use.
        self.deadline = deadline
        # Committed ranges, sorted by start (parallel lists; ends are aligned).
        self.starts: list[int] = []
        self.ends: list[int] = []

    @property
    def size(self) -> int:
        return self.end - self.start

    def claim(self, offset: int, length: int) -> bool:
        """Record [offset, offset+length) as committed; False when it leaves the arena or
        overlaps a range committed before."""
        end = offset + length
        if offset < self.start or end > self.end:
            return False
        starts, ends = self.starts, self.ends
        if not starts or offset >= ends[-1]:  # the usual case: past everything so far
            starts.append(offset)
            ends.append(end)
            return True
        i = bisect.bisect_right(starts, offset)
        if (i and ends[i - 1] > offset) or (i < len(starts) and starts[i] < end):
            return False
        starts.insert(i, offset)
        ends.insert(i, end)
        return True

    def gaps(self) -> list[tuple[int, int]]:
        """`(offset, size)` of every part never committed."""
        out: list[tuple[int, int]] = []
        cur = self.start
        for s, e in zip(self.starts, self.ends, strict=True):
            if s > cur:
                out.append((cur, s - cur))
            cur = e
        if cur < self.end:
            out.append((cur, self.end - cur))
        return out


class ArenaTable(MetadataObserver):
    """Live arenas by id and by client, and ghosts by segment name (a `MetadataObserver`)."""

    def __init__(self, core: MetadataCore) -> None:
        self._core = core
        self._config = core.config
        self._clock = core.clock
        self._arenas: dict[int, Arena] = {}
        #: `get(arena_id)`: the live arena, or None. The dict's own bound `get` (the dict is
        #: never replaced), so the commit path's lookup costs no Python call.
        self.get: Callable[[int], Arena | None] = self._arenas.get
        self._arenas_of: dict[ClientId, dict[int, Arena]] = {}
        self._ghosts: dict[SegmentName, list[tuple[int, int, float]]] = {}
        #: Seconds a request naming an arena keeps it the client's.
        self.lease = min(ARENA_LEASE_S, self._config.client_ttl)

    def arenas_of(self, client_id: ClientId) -> list[Arena]:
        """The client's live arenas."""
        return list(self._arenas_of.get(client_id, {}).values())

    def stats(self) -> tuple[int, int]:
        """(arenas, bytes they hold)."""
        return len(self._arenas), sum(x.size for x in self._arenas.values())

    def lent(self) -> list[tuple[Segment, int, int]]:
        """(segment, offset, size) of every part of a live arena not yet committed."""
        return [(a.segment, o, n) for a in self._arenas.values() for o, n in a.gaps()]

    def renew(self, arena: Arena) -> None:
        """A request named `arena`: it stays the client's for another lease."""
        arena.deadline = self._clock() + self.lease

    def reserve(self, client_id: ClientId, size: int, min_size: int) -> tuple[int, Arena | None]:
        """A new arena of `size` bytes (less when that does not fit, down to `min_size`), or
        NO_AVAILABLE_HANDLE: the client holds `MAX_ARENAS_PER_CLIENT`, nothing has room, or
        arenas would take more than a quarter of the segment. Never evicts."""
        mine = self._arenas_of.get(client_id)
        if mine is not None and len(mine) >= MAX_ARENAS_PER_CLIENT:
            return NO_AVAILABLE_HANDLE, None
        core = self._core
        live = core.segments.live
        if not live:
            return NO_AVAILABLE_HANDLE, None
        # Never more than max_arena_size, nor an eighth of the largest segment.
        cap = min(self._config.max_arena_size, max(s.allocator.capacity for s in live) // 8)
        a = self._config.alignment
        size = min(size, cap) // a * a
        need = core.aligned(max(min_size, 1))
        if size < need:
            return NO_AVAILABLE_HANDLE, None
        got = core.reserve_range(client_id, size, need)
        if got is None:
            return NO_AVAILABLE_HANDLE, None
        seg, off, size = got
        held = sum(x.size for x in self._arenas.values() if x.segment is seg)
        if held + size > seg.allocator.capacity // 4:
            core.free_range(seg, off, size)
            return NO_AVAILABLE_HANDLE, None
        arena_id = _ids.getrandbits(62) + 1
        while arena_id in self._arenas:
            arena_id = _ids.getrandbits(62) + 1
        arena = Arena(arena_id, client_id, seg, off, size, deadline=self._clock() + self.lease)
        self._arenas[arena_id] = arena
        self._arenas_of.setdefault(client_id, {})[arena_id] = arena
        return OK, arena

    def release(self, client_id: ClientId, ids: list[int]) -> None:
        """Let go of the client's arenas `ids` (unknown ones are ignored): their gaps are
        freed; committed ranges belong to their objects."""
        mine = self._arenas_of.get(client_id)
        if not mine:
            return
        for arena_id in ids:
            arena = mine.get(arena_id)
            if arena is not None:
                self._forget(arena)
                for off, size in arena.gaps():
                    self._core.free_range(arena.segment, off, size)

    def _forget(self, arena: Arena) -> None:
        """Drop `arena` from both indexes (its ranges are the caller's business)."""
        del self._arenas[arena.arena_id]
        mine = self._arenas_of[arena.client_id]
        del mine[arena.arena_id]
        if not mine:
            del self._arenas_of[arena.client_id]

    def expire_idle(self) -> int:
        """Release arenas unused for `put_start_release_timeout` past their lease (an idle or
        vanished client, a lost ReserveArena answer) and forget ghosts whose time is up;
        answers how many arenas were released."""
        if not self._arenas and not self._ghosts:
            return 0
        now = self._clock()
        limit = now - self._config.put_start_release_timeout
        idle = [x for x in self._arenas.values() if x.deadline <= limit]
        for arena in idle:
            self.release(arena.client_id, [arena.arena_id])
        for name in [n for n, g in self._ghosts.items() if all(u <= now for _, _, u in g)]:
            del self._ghosts[name]
        return len(idle)

    # ------------------------------------------------------------------ MetadataObserver

    @override
    def object_removed(self, obj: ObjectMeta) -> None:
        pass  # a committed range is its object's: nothing of the arena's goes with it

    @override
    def client_expired(self, client_id: ClientId) -> None:
        """Park the gaps of the expired client's arenas until `put_start_release_timeout` past
        their deadline (it may only have fallen silent, and still be writing)."""
        now = self._clock()
        for arena in self.arenas_of(client_id):
            self._forget(arena)
            if arena.segment.alive:
                until = max(now, arena.deadline) + self._config.put_start_release_timeout
                for off, size in arena.gaps():
                    self._core.park_range(arena.segment, off, size, until)

    @override
    def client_silenced(self, client_id: ClientId) -> None:
        """A silent client's arenas are parked as an expired one's: it may still write."""
        self.client_expired(client_id)

    @override
    def segment_restored(self, seg: Segment) -> None:
        pass  # arenas of others on it were kept; commits into them are accepted again

    @override
    def replicas_lost(self, obj: ObjectMeta) -> None:
        pass

    @override
    def segment_unmounted(self, seg: Segment) -> None:
        """Forget the arenas on the unmounted segment (its allocator is gone), leaving ghosts of
        their uncommitted ranges for a mount of the same name (`arenas.py`); ranges parked
        there for late writers (expired clients' arenas, preempted PutStarts) become ghosts
        too, until their own release time."""
        ghosts = self._core.parked.on_segment(seg, self._clock())
        if ghosts:
            self._ghosts.setdefault(seg.name, []).extend(ghosts)
        grace = self._config.put_start_release_timeout
        for arena in [a for a in self._arenas.values() if a.segment is seg]:
            until = arena.deadline + grace
            self._ghosts.setdefault(seg.name, []).extend(
                (off, size, until) for off, size in arena.gaps()
            )
            self._forget(arena)

    @override
    def segment_mounted(self, seg: Segment) -> None:
        """A segment named like one that went away with arenas on it: take their uncommitted
        ranges again and park them until a writer of the old mount can no longer write."""
        if not self._ghosts:
            return
        ghosts = self._ghosts.pop(seg.name, None)
        if not ghosts:
            return
        now = self._clock()
        for off, size, until in ghosts:
            if until > now:
                self._core.take_range(seg, off, size, until)
        log.info("segment %s mounted again: %d range(s) kept reserved", seg.name, len(ghosts))
