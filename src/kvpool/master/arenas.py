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

Failure rules, as for in-flight PutStarts: the arenas of an expired client are parked until
`put_start_release_timeout` (a client that only fell silent may still be writing into them);
an arena on an unmounted segment simply vanishes (its allocator went with the segment); a
commit naming an arena the master does not know answers INVALID_WRITE, and the client falls
back to PutStart/PutEnd. Arena ids are random 62-bit numbers, so an arena of a previous master
process is never mistaken for one of this one.
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
    DEFAULT_REPLICATE_CONFIG,
    DEFAULT_TENANT,
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


class Arena:
    """A range of one segment lent to one client for its one-round-trip puts."""

    __slots__ = ("arena_id", "client_id", "end", "ends", "segment", "start", "starts")

    def __init__(
        self, arena_id: int, client_id: ClientId, segment: Segment, start: int, size: int
    ) -> None:
        self.arena_id = arena_id
        self.client_id = client_id
        self.segment = segment
        self.start = start
        self.end = start + size
        # Committed ranges, sorted by start (parallel lists; ends are aligned).
        self.starts: list[int] = []
        self.ends: list[int] = []

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

    #: Every live arena by id, and each client's arenas (both kept in step).
    _arenas: dict[int, Arena]
    _arenas_of: dict[ClientId, dict[int, Arena]]

    # ------------------------------------------------------------ reserve / release

    def reserve_arena(self, req: ReserveArena) -> ArenaReply:
        cid = req.client_id
        if not self._config.max_arena_size:
            return ArenaReply(_NOT_SUPPORTED)
        if not cid or req.size <= 0 or req.min_size < 0 or req.min_size > req.size:
            return ArenaReply(_INVALID_PARAMS)
        if req.retire:
            self._release_ids(cid, req.retire)
        align = self._config.alignment
        live = self.segments.live
        if not live:
            return ArenaReply(_NO_SPACE)
        # Never more than max_arena_size, nor an eighth of the largest segment: arenas must
        # not hoard a small pool.
        cap = min(self._config.max_arena_size, max(s.allocator.capacity for s in live) // 8)
        size = self._aligned(min(req.size, cap))
        need = self._aligned(max(req.min_size, 1))
        if size < need:
            return ArenaReply(_NO_SPACE)
        # Placed as a plain one-replica put of the whole arena (strategy, local host, direct
        # reclaim when the pool is full), without touching any tenant's metadata.
        plan = _PutPlan(_OK, cid, DEFAULT_TENANT, DEFAULT_REPLICATE_CONFIG, None)
        plan.simple = self._placement.strategy is AllocationStrategy.RANDOM
        got = self._allocate(size, plan)
        if not got:
            return ArenaReply(_NO_SPACE)
        seg, off = got[0].segment, got[0].offset
        seg.objects -= 1  # placement counted a replica; an arena is not one
        arena_id = _ids.getrandbits(62) + 1
        while arena_id in self._arenas:
            arena_id = _ids.getrandbits(62) + 1
        arena = Arena(arena_id, cid, seg, off, size)
        self._arenas[arena_id] = arena
        self._arenas_of.setdefault(cid, {})[arena_id] = arena
        return ArenaReply(_OK, arena_id, seg.name, off, size, align, seg.endpoint)

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
            arena = mine.pop(arena_id, None)
            if arena is not None:
                del self._arenas[arena_id]
                self._free_gaps(arena)
        if not mine:
            del self._arenas_of[client_id]

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
        mine = self._arenas_of.pop(client_id, None)
        if not mine:
            return
        release_at = self._clock() + self._config.put_start_release_timeout
        for arena in mine.values():
            del self._arenas[arena.arena_id]
            if arena.segment.alive:
                for off, size in arena.gaps():
                    self._park_until(release_at, size, (Replica(arena.segment, off, _COMPLETE),))
                    arena.segment.objects += 1  # a parked range is freed as one replica

    def _drop_arenas_on(self, seg: Segment) -> None:
        """Forget the arenas on an unmounted segment (nothing to free: its allocator is gone)."""
        for arena in [a for a in self._arenas.values() if a.segment is seg]:
            del self._arenas[arena.arena_id]
            mine = self._arenas_of.get(arena.client_id)
            if mine is not None:
                mine.pop(arena.arena_id, None)
                if not mine:
                    del self._arenas_of[arena.client_id]

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
        plan = self._plan(client_id, tenant, cfg, n)
        if plan.code != _OK:
            return None, None, plan.code
        if cfg.replica_num != 1 or cfg.preferred_segments:
            return None, None, _INVALID_PARAMS  # arenas hold one replica, placed by the master
        arena = self._arenas.get(arena_id)
        if arena is None or arena.client_id != client_id or not arena.segment.alive:
            return None, None, _INVALID_WRITE
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
        on_complete = self._hooks.on_replica_complete
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
            obj.soft_pin_deadline = pin_deadline
            on_complete(obj, replica)
            out.append(_OK)
        return out
