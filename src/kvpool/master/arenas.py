"""Arenas: the master's side of a put in one round trip (ReserveArena, PutCommit, ReleaseArenas).

A put through PutStart and PutEnd costs two round trips to the master: one to be given a range,
one to make the object readable. An *arena* moves the first one off the per-put path: the master
allocates a client a range of one segment (`ReserveArena`, once per many puts), the client cuts
each value's range from it itself, writes the value there and sends `PutCommit`, which creates
the object COMPLETE in one step. A batch commits all its keys in one `BatchPutCommit`.

What the master keeps per arena (`Arena`): its owner, segment and range, and the ranges
committed from it so far (sorted start and end lists; commits arrive mostly in increasing
order, so inserting is an append). A commit is accepted only for a range inside the arena that
overlaps nothing committed before, so a buggy or malicious client can never make two objects
share bytes. A committed range belongs to its object from then on: removing, evicting or moving
the object frees it, exactly as a range from PutStart. Releasing an arena frees its gaps (what
was never committed, e.g. the tail, or a range whose commit found the key already there).

An arena is a *lease*: the client writes into an arena only for half of `arena_lease` (2 s, or
`client_ttl` when shorter) after the sending of the last request the master answered for it
(the ReserveArena, or any commit naming it); each of those pushes the master's `deadline` to
now + lease. So once the master forgets an arena, no write into it *starts* after its deadline,
and a write that started before may run as long as a put may (`put_start_release_timeout`,
the bound PutStart's parking uses). Hence, whenever the master lets go of an arena without the
client asking, its uncommitted ranges stay reserved until deadline + release timeout:

* the arenas of an expired client are parked (as its in-flight PutStarts are);
* an arena unused past that time (an idle or vanished client, a ReserveArena whose answer was
  lost) is released by `release_stale`;
* an arena on an unmounted segment leaves a *ghost* (segment name, range, until): if a segment
  of that name is mounted again before then (the same owner coming back after it expired), the
  ranges are taken again in its fresh allocator and parked, so no other put lands where a
  writer of the old mount may still write.

A commit naming an arena the master does not know answers INVALID_WRITE, and the client falls
back to PutStart/PutEnd. Arena ids are random 62-bit numbers, so an arena of a previous master
process is never mistaken for one of this one. (A restarted master knows no ghosts: a client
notices the restart at its next ping, within a second, and stops using its arenas then; a write
in that second could land on a range the new master handed out, which the readers' checksum
turns into CHECKSUM_MISMATCH, never wrong bytes, as for a PutStart in flight at a restart.)

Limits, so arenas never hoard a pool: an arena is at most `max_arena_size` and an eighth of the
largest segment; a client holds at most `MAX_ARENAS_PER_CLIENT`; arenas take at most a quarter
of a segment; ReserveArena never evicts (a full pool is PutStart's business, whose direct
reclaim frees what one put needs) and grants the largest free block when the asked size does
not fit, down to `min_size`.
"""

from __future__ import annotations

import bisect
import logging
import random

import xxhash

from kvpool.errors import ErrorCode
from kvpool.master.config import AllocationStrategy
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.segments import Segment
from kvpool.master.state import (
    _COMPLETE,
    _EXISTS,
    _INVALID_PARAMS,
    _INVALID_WRITE,
    _NO_SPACE,
    _OK,
    _OK_REPLY,
    ServiceState,
)
from kvpool.master.writes import WritePath, _PutPlan
from kvpool.protocol.messages import (
    ArenaReply,
    BatchPutCommit,
    BatchReply,
    ClientId,
    PutCommit,
    ReleaseArenas,
    ReplicateConfigMsg,
    Reply,
    ReserveArena,
    TenantId,
)

__all__ = ["Arena", "ArenaPath"]

log = logging.getLogger(__name__)

_ids = random.SystemRandom()
_NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)

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


class ArenaPath(WritePath, ServiceState):
    """ReserveArena / PutCommit / BatchPutCommit / ReleaseArenas, and arena cleanup."""

    @property
    def arena_lease(self) -> float:
        return min(ARENA_LEASE_S, self._config.client_ttl)

    # ------------------------------------------------------------ reserve / release

    def reserve_arena(self, req: ReserveArena) -> ArenaReply:
        cid = req.client_id
        if not self._config.max_arena_size:
            return ArenaReply(_NOT_SUPPORTED)
        if not cid or req.size <= 0 or req.min_size < 0 or req.min_size > req.size:
            return ArenaReply(_INVALID_PARAMS)
        if req.retire:
            self._release_ids(cid, req.retire)
        mine = self._arenas_of.get(cid)
        if mine is not None and len(mine) >= MAX_ARENAS_PER_CLIENT:
            return ArenaReply(_NO_SPACE)
        live = self.segments.live
        if not live:
            return ArenaReply(_NO_SPACE)
        # Never more than max_arena_size, nor an eighth of the largest segment.
        cap = min(self._config.max_arena_size, max(s.allocator.capacity for s in live) // 8)
        a = self._config.alignment
        size = min(req.size, cap) // a * a
        need = self._aligned(max(req.min_size, 1))
        if size < need:
            return ArenaReply(_NO_SPACE)
        got = self._arena_range(cid, size, need)
        if got is None:
            return ArenaReply(_NO_SPACE)
        seg, off, size = got
        arena_id = _ids.getrandbits(62) + 1
        while arena_id in self._arenas:
            arena_id = _ids.getrandbits(62) + 1
        lease = self.arena_lease
        arena = Arena(arena_id, cid, seg, off, size, deadline=self._clock() + lease)
        self._arenas[arena_id] = arena
        self._arenas_of.setdefault(cid, {})[arena_id] = arena
        return ArenaReply(_OK, arena_id, seg.name, off, size, a, seg.endpoint, round(lease * 1000))

    def _arena_range(
        self, client_id: ClientId, size: int, need: int
    ) -> tuple[Segment, int, int] | None:
        """(segment, offset, size) for a new arena of `size` bytes, or of the largest free
        block down to `need`; placed by the master's strategy, never by evicting anything,
        and never past a quarter of a segment in arenas."""
        host = None
        if self._placement.strategy is AllocationStrategy.LOCAL_FIRST:
            rec = self.clients.get(client_id)
            host = rec.host_id if rec is not None else None
        got = self._placement.allocate(self.segments, size, 1, local_host=host)
        if got:
            seg, off = got[0]
            seg.objects -= 1  # placement counted a replica; an arena is not one
        else:
            seg = max(self.segments.live, key=lambda x: x.allocator.largest_free())
            a = self._config.alignment
            size = min(size, seg.allocator.largest_free() // a * a)
            if size < need:
                return None
            found = seg.allocator.alloc(size)
            if found is None:
                return None
            off = found
        held = sum(x.size for x in self._arenas.values() if x.segment is seg)
        if held + size > seg.allocator.capacity // 4:
            seg.allocator.free(off, size)
            return None
        return seg, off, size

    def release_arenas(self, req: ReleaseArenas) -> Reply:
        if not req.client_id:
            return Reply(_INVALID_PARAMS)
        self._release_ids(req.client_id, req.arena_ids)
        return _OK_REPLY

    def _release_ids(self, client_id: ClientId, ids: list[int]) -> None:
        mine = self._arenas_of.get(client_id)
        if not mine:
            return
        for arena_id in ids:
            arena = mine.get(arena_id)
            if arena is not None:
                self._forget_arena(arena)
                self._free_gaps(arena)

    def _forget_arena(self, arena: Arena) -> None:
        """Drop `arena` from both indexes (its ranges are the caller's business)."""
        del self._arenas[arena.arena_id]
        mine = self._arenas_of[arena.client_id]
        del mine[arena.arena_id]
        if not mine:
            del self._arenas_of[arena.client_id]

    def _free_gaps(self, arena: Arena) -> None:
        seg = arena.segment
        if seg.alive:
            for off, size in arena.gaps():
                seg.allocator.free(off, size)

    def arenas_of(self, client_id: ClientId) -> list[Arena]:
        """The client's live arenas (for stats and tests)."""
        return list(self._arenas_of.get(client_id, {}).values())

    def _expire_arenas(self, client_id: ClientId) -> None:
        """Park the gaps of an expired client's arenas until `put_start_release_timeout` (it
        may only have fallen silent, and still be writing)."""
        now = self._clock()
        for arena in self.arenas_of(client_id):
            self._forget_arena(arena)
            if arena.segment.alive:
                until = max(now, arena.deadline) + self._config.put_start_release_timeout
                for off, size in arena.gaps():
                    self._park_range(arena.segment, off, size, until)

    def _park_range(self, seg: Segment, off: int, size: int, until: float) -> None:
        """Keep [off, off + size) of `seg` allocated until `until` (a late writer may use it)."""
        self._park_until(until, size, (Replica(seg, off, _COMPLETE),))
        seg.objects += 1  # a parked range is freed as one replica

    def _expire_idle_arenas(self) -> int:
        """Release arenas unused for `put_start_release_timeout` past their lease (an idle or
        vanished client, a lost ReserveArena answer) and forget ghosts whose time is up;
        answers how many arenas were released."""
        now = self._clock()
        limit = now - self._config.put_start_release_timeout
        idle = [x for x in self._arenas.values() if x.deadline <= limit]
        for arena in idle:
            self._release_ids(arena.client_id, [arena.arena_id])
        for name in [n for n, g in self._ghosts.items() if all(u <= now for _, _, u in g)]:
            del self._ghosts[name]
        return len(idle)

    def _drop_arenas_on(self, seg: Segment) -> None:
        """Forget the arenas on an unmounted segment (its allocator is gone), leaving ghosts of
        their uncommitted ranges for a mount of the same name (module docstring); ranges parked
        there for late writers (expired clients' arenas, preempted PutStarts) become ghosts
        too, until their own release time."""
        now = self._clock()
        ghosts = [
            (r.offset, size, until)
            for until, _, size, reps in self._parked
            if until > now
            for r in reps
            if r.segment is seg
        ]
        if ghosts:
            self._ghosts.setdefault(seg.name, []).extend(ghosts)
        grace = self._config.put_start_release_timeout
        for arena in [a for a in self._arenas.values() if a.segment is seg]:
            until = arena.deadline + grace
            self._ghosts.setdefault(seg.name, []).extend(
                (off, size, until) for off, size in arena.gaps()
            )
            self._forget_arena(arena)

    def _restore_ghosts(self, seg: Segment) -> None:
        """A segment named like one that went away with arenas on it: take their uncommitted
        ranges again and park them until a writer of the old mount can no longer write."""
        ghosts = self._ghosts.pop(seg.name, None)
        if not ghosts:
            return
        now = self._clock()
        for off, size, until in ghosts:
            if until > now and seg.allocator.alloc_at(off, size):
                self._park_range(seg, off, size, until)
        log.info("segment %s mounted again: %d range(s) kept reserved", seg.name, len(ghosts))

    def arena_stats(self) -> tuple[int, int]:
        """(arenas, bytes they hold)."""
        return len(self._arenas), sum(x.size for x in self._arenas.values())

    # ------------------------------------------------------------ commit

    def put_commit(self, req: PutCommit) -> Reply:
        plan, arena, code = self._commit_plan(req.client_id, req.tenant, req.config, req.arena_id)
        if code != _OK:
            return Reply(code)
        assert plan is not None and arena is not None
        groups = req.config.group_ids
        sums = [req.checksum] if req.checksum is not None else None
        (code,) = self._commit_many(plan, arena, [req.key], [req.size], [req.offset], sums, groups)
        return _OK_REPLY if code == _OK else Reply(code)

    def batch_put_commit(self, req: BatchPutCommit) -> BatchReply:
        keys, sizes, offsets, sums = req.keys, req.sizes, req.offsets, req.checksums
        n = len(keys)
        plan, arena, code = self._commit_plan(
            req.client_id, req.tenant, req.config, req.arena_id, n
        )
        if code == _OK and (len(sizes) != n or len(offsets) != n or (sums and len(sums) != n)):
            code = _INVALID_PARAMS
        if code != _OK:
            return BatchReply([code] * n)
        assert plan is not None and arena is not None
        return BatchReply(
            self._commit_many(plan, arena, keys, sizes, offsets, sums or None, req.config.group_ids)
        )

    def _commit_plan(
        self,
        client_id: ClientId,
        tenant: TenantId,
        cfg: ReplicateConfigMsg,
        arena_id: int,
        n: int = 1,
    ) -> tuple[_PutPlan | None, Arena | None, int]:
        # The arena first: any answer but INVALID_WRITE tells the client its arena is alive,
        # so the lease is renewed whatever else the request gets wrong.
        arena = self._arenas.get(arena_id)
        if arena is None or arena.client_id != client_id or not arena.segment.alive:
            return None, None, _INVALID_WRITE
        arena.deadline = self._clock() + self.arena_lease
        plan = self._plan(client_id, tenant, cfg, n)
        if plan.code != _OK:
            return None, None, plan.code
        if cfg.replica_num != 1 or cfg.preferred_segments:
            return None, None, _INVALID_PARAMS  # arenas hold one replica, placed by the master
        return plan, arena, _OK

    def _commit_many(  # noqa: PLR0917
        self,
        plan: _PutPlan,
        arena: Arena,
        keys: list[str],
        sizes: list[int],
        offsets: list[int],
        sums: list[int] | None,
        groups: list[str] | None,
    ) -> list[int]:
        """Create the objects of a (batch) commit; one code per key. A tight loop with the
        per-request lookups hoisted, as the other batch handlers: it runs once per key."""
        t = plan.shards
        assert t is not None
        now = self._clock()
        mask = self._config.alignment - 1
        seed, shards = t.seed, t.shards
        nshards = len(shards)
        h = xxhash.xxh3_64_intdigest
        claim = arena.claim
        seg = arena.segment
        discard = self._discard_timeout
        done: list[tuple[ObjectMeta, Replica]] = []
        tenant, client_id = plan.tenant, plan.client_id
        soft_pin, hard_pin = plan.soft_pin, plan.hard_pin
        pin_deadline = now + soft_pin if soft_pin is not None else None
        index = self._index
        out: list[int] = []
        for i, key in enumerate(keys):
            size = sizes[i]
            offset = offsets[i]
            if not key or size <= 0 or offset & mask:
                out.append(_INVALID_PARAMS)
                continue
            shard = h(key.encode(), seed) % nshards
            d = shards[shard]
            old = d.get(key)
            if old is not None:
                if not old.has_live_replica():
                    self._forget_dead(old)
                elif old.complete or now - old.put_start_time < discard:
                    out.append(_EXISTS)
                    continue
                else:
                    self._preempt(old)
            if not claim(offset, (size + mask) & ~mask):
                out.append(_INVALID_PARAMS)
                continue
            seg.objects += 1
            replica = Replica(seg, offset, _COMPLETE)
            obj = ObjectMeta(
                key,
                tenant,
                shard,
                size,
                client_id,
                (replica,),
                now,
                soft_pin,
                hard_pin,
                groups[i] if groups else "",
            )
            d[key] = obj
            index.count += 1
            obj.complete = True
            obj.checksum = sums[i] if sums else None
            obj.lease_deadline = now
            done.append((obj, replica))
            out.append(_OK)
        if done:
            # One hook call for the batch, before the pin deadlines are set (as at PutEnd).
            self._hooks.on_replicas_complete(done)
            if pin_deadline is not None:
                for obj, _ in done:
                    obj.soft_pin_deadline = pin_deadline
        return out
