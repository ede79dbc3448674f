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

Decide, claim, then apply: a commit first asks the put planner whether the key may be taken
(`planner.py`), then claims its range in the arena, and only then forgets a dead holder or
preempts a stale write, so a refused commit (the key exists, the range leaves the arena or
overlaps) changes nothing.

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

The arenas themselves (by id, by client, and the ghosts) are kept by `ArenaTable`
(`arena_table.py`); this module answers the requests.
"""

from __future__ import annotations

import xxhash

from kvpool.codes import (
    INVALID_PARAMS,
    INVALID_WRITE,
    NOT_SUPPORTED,
    OBJECT_ALREADY_EXISTS,
    OK,
    TENANT_QUOTA_EXCEEDED,
)
from kvpool.master.arena_table import Arena, ArenaTable
from kvpool.master.core import MetadataCore
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.planner import Claim, PutPlan, PutPlanner
from kvpool.protocol.messages import (
    ArenaReply,
    BatchPutCommit,
    BatchReply,
    ClientId,
    PutCommit,
    ReleaseArenas,
    ReplicaStatus,
    ReplicateConfigMsg,
    Reply,
    ReserveArena,
    TenantId,
)

__all__ = ["ArenaPath"]

_COMPLETE = ReplicaStatus.COMPLETE
_EXISTS = Claim.EXISTS
_OK_REPLY = Reply(OK)
_INVALID_WRITE_REPLY = Reply(INVALID_WRITE)


class ArenaPath:
    """ReserveArena / PutCommit / BatchPutCommit / ReleaseArenas."""

    def __init__(self, core: MetadataCore, planner: PutPlanner, arenas: ArenaTable) -> None:
        self._core = core
        self._planner = planner
        self._arenas = arenas
        self._config = core.config
        self._clock = core.clock

    def reserve_arena(self, req: ReserveArena) -> ArenaReply:
        cid = req.client_id
        if not self._config.max_arena_size:
            return ArenaReply(NOT_SUPPORTED)
        if not cid or req.size <= 0 or req.min_size < 0 or req.min_size > req.size:
            return ArenaReply(INVALID_PARAMS)
        if req.retire:
            self._arenas.release(cid, req.retire)
        code, arena = self._arenas.reserve(cid, req.size, req.min_size)
        if arena is None:
            return ArenaReply(code)
        seg = arena.segment
        return ArenaReply(
            OK,
            arena.arena_id,
            seg.name,
            arena.start,
            arena.size,
            self._config.alignment,
            seg.endpoint,
            round(self._arenas.lease * 1000),
        )

    def release_arenas(self, req: ReleaseArenas) -> Reply:
        if not req.client_id:
            return Reply(INVALID_PARAMS)
        self._arenas.release(req.client_id, req.arena_ids)
        return _OK_REPLY

    def put_commit(self, req: PutCommit) -> Reply:
        # `_commit_plan`, inlined for the one-key request: the same checks in the same order.
        arena = self._arenas.get(req.arena_id)
        client_id = req.client_id
        if arena is None or arena.client_id != client_id:
            return _INVALID_WRITE_REPLY
        seg = arena.segment
        if not seg.serving or seg.draining:
            return _INVALID_WRITE_REPLY
        arena.deadline = self._clock() + self._arenas.lease  # ArenaTable.renew
        cfg = req.config
        plan = self._planner.plan(client_id, req.tenant, cfg, 1)
        if plan.code != OK:
            return Reply(plan.code)
        if cfg.replica_num != 1 or cfg.preferred_segments:
            if plan.fresh_tenant:
                self._planner.finish(plan)
            return Reply(INVALID_PARAMS)
        code = self._commit_one(plan, arena, req)
        if plan.fresh_tenant:
            self._planner.finish(plan)
        return _OK_REPLY if code == OK else Reply(code)

    def _commit_one(self, plan: PutPlan, arena: Arena, req: PutCommit) -> int:
        """`_commit_many` of one key (a PutCommit), without the batch's lists and loop: the
        same checks in the same order, the same outcome. A tenant with a quota takes the batch
        code itself (one rule for what a commit is charged, kept in one place)."""
        key, size, offset = req.key, req.size, req.offset
        if plan.quota is not None:
            sums = [req.checksum] if req.checksum is not None else None
            groups = req.config.group_ids
            return self._commit_many(plan, arena, [key], [size], [offset], sums, groups)[0]
        mask = self._config.alignment - 1
        if not key or size <= 0 or offset & mask:
            return INVALID_PARAMS
        t = plan.shards
        assert t is not None
        now = self._clock()
        shard = xxhash.xxh3_64_intdigest(key.encode(), t.seed) % len(t.shards)
        d = t.shards[shard]
        old = d.get(key)
        verdict = None
        if old is not None:
            verdict = self._planner.claim(old, now)
            if verdict is _EXISTS:
                return OBJECT_ALREADY_EXISTS
        if not arena.claim(offset, (size + mask) & ~mask):
            return INVALID_PARAMS
        core = self._core
        if verdict is not None:
            assert old is not None
            core.clear_holder(old, verdict)
        replica = Replica(arena.segment, offset, _COMPLETE)
        soft_pin = plan.soft_pin
        groups = req.config.group_ids
        obj = ObjectMeta(
            key,
            plan.tenant,
            shard,
            size,
            plan.client_id,
            (replica,),
            now,
            soft_pin,
            plan.hard_pin,
            groups[0] if groups else "",
            1,
            True,  # complete
            req.checksum,
            now,  # lease_deadline
        )
        core.create_committed(d, obj)
        core.commit_objects([(obj, replica)], now + soft_pin if soft_pin is not None else None)
        return OK

    def batch_put_commit(self, req: BatchPutCommit) -> BatchReply:
        keys, sizes, offsets, sums = req.keys, req.sizes, req.offsets, req.checksums
        n = len(keys)
        plan, arena, code = self._commit_plan(
            req.client_id, req.tenant, req.config, req.arena_id, n
        )
        if code == OK and (len(sizes) != n or len(offsets) != n or (sums and len(sums) != n)):
            code = INVALID_PARAMS
        if code != OK:
            if plan is not None and plan.fresh_tenant:
                self._planner.finish(plan)
            return BatchReply([code] * n)
        assert plan is not None and arena is not None
        codes = self._commit_many(
            plan, arena, keys, sizes, offsets, sums or None, req.config.group_ids
        )
        if plan.fresh_tenant:
            self._planner.finish(plan)
        return BatchReply(codes)

    def _commit_plan(
        self,
        client_id: ClientId,
        tenant: TenantId,
        cfg: ReplicateConfigMsg,
        arena_id: int,
        n: int = 1,
    ) -> tuple[PutPlan | None, Arena | None, int]:
        # The arena first: any answer but INVALID_WRITE tells the client its arena is alive,
        # so the lease is renewed whatever else the request gets wrong.
        arena = self._arenas.get(arena_id)
        if (
            arena is None
            or arena.client_id != client_id
            or not arena.segment.serving
            or arena.segment.draining
        ):
            # (A silent or draining segment takes no new object: the client falls back to
            # PutStart.)
            return None, None, INVALID_WRITE
        self._arenas.renew(arena)
        plan = self._planner.plan(client_id, tenant, cfg, n)
        if plan.code != OK:
            return None, None, plan.code
        if cfg.replica_num != 1 or cfg.preferred_segments:
            if plan.fresh_tenant:
                self._planner.finish(plan)
            return None, None, INVALID_PARAMS  # arenas hold one replica, placed by the master
        return plan, arena, OK

    def _commit_many(  # noqa: PLR0917
        self,
        plan: PutPlan,
        arena: Arena,
        keys: list[str],
        sizes: list[int],
        offsets: list[int],
        sums: list[int] | None,
        groups: list[str] | None,
    ) -> list[int]:
        """Create the objects of a (batch) commit; one code per key. A tight loop with the
        per-request lookups hoisted, as the other batch handlers: it runs once per key.

        Per key: decide (the planner's claim rule), claim the range in the arena, and only
        then let go of the key's old holder, so a refused key changes nothing."""
        t = plan.shards
        assert t is not None
        core = self._core
        now = self._clock()
        mask = self._config.alignment - 1
        seed, shards = t.seed, t.shards
        nshards = len(shards)
        h = xxhash.xxh3_64_intdigest
        claim = arena.claim
        may_claim = self._planner.claim
        admits = self._planner.admits
        clear_holder = core.clear_holder
        create = core.create_committed
        seg = arena.segment
        done: list[tuple[ObjectMeta, Replica]] = []
        tenant, client_id = plan.tenant, plan.client_id
        soft_pin, hard_pin = plan.soft_pin, plan.hard_pin
        pin_deadline = now + soft_pin if soft_pin is not None else None
        out: list[int] = []
        for i, key in enumerate(keys):
            size = sizes[i]
            offset = offsets[i]
            if not key or size <= 0 or offset & mask:
                out.append(INVALID_PARAMS)
                continue
            shard = h(key.encode(), seed) % nshards
            d = shards[shard]
            old = d.get(key)
            verdict = None
            if old is not None:
                verdict = may_claim(old, now)
                if verdict is _EXISTS:
                    out.append(OBJECT_ALREADY_EXISTS)
                    continue
            if plan.quota is not None and not admits(
                plan, size, old.size if old is not None else 0, old
            ):
                out.append(TENANT_QUOTA_EXCEEDED)
                continue
            if not claim(offset, (size + mask) & ~mask):
                out.append(INVALID_PARAMS)
                continue
            if verdict is not None:
                assert old is not None
                clear_holder(old, verdict)
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
                1,
                True,  # complete
                sums[i] if sums else None,
                now,  # lease_deadline
            )
            create(d, obj)
            done.append((obj, replica))
            out.append(OK)
        if done:
            # One hook call for the batch, before the pin deadlines are set (as at PutEnd).
            core.commit_objects(done, pin_deadline)
        return out
