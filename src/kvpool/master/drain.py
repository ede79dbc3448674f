"""Graceful drain of a segment (GRACEFULLY_UNMOUNTING): move out what must not be lost, then
unmount.

`DrainTable.start(name, grace)` takes the segment out of placement at once
(`SegmentTable.drain`: it leaves `live`, so no PutStart, arena, PutCommit, repair copy or task
target lands there; it stays mounted and readable). The server's drain tick (`tick`, a few
times a second, only while a drain runs) then walks each job through:

    scanning        the objects with a replica on the segment, `_SCAN_SHARDS` shards per tick
                    (a million-object index never stalls the loop)
    moving          each object that must not be lost (hard pinned, soft pinned now, or, in
                    pool mode, whose only readable replica is this one) is moved to another
                    segment through a MOVE task (`TaskTable.swap_out`, the reclaim's own
                    machinery: the segment's owner copies, the master switches the metadata);
                    a move refused (no room, a task already on the object) is retried each tick
                    until the grace runs out
    waiting_leases  until no object on the segment holds a read lease, or the grace ends
    done            the segment is unmounted (what is left on it goes: unpinned cache copies)

`aborted`: the segment went away first (its owner died or unmounted it). The table is told
nothing by observers; each tick checks `Segment.alive` (O(1)). Jobs are kept for `_KEEP_DONE`
seconds after they end, for `DrainStatus`.

A drain survives a restart and a failover: its start is logged (`oplog.DrainRec`: the mount, the
wall-clock end of its grace) into the data directory and the HA standbys' copies, and
`MetadataCore.draining` holds the running ones. A master that loads such a state
(`durable.build`: the segment comes back out of placement) has the drain's end in `draining`
and no job: `adopt` (the first tick) starts the job again, scanning anew, to the same end. The
moves that were under way on the old master are not in the log (tasks are not); the new job
asks for them again. The progress counters start again from zero; `elapsed_s` does not.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvpool.codes import INVALID_PARAMS, OBJECT_NOT_FOUND, OK, SEGMENT_NOT_FOUND
from kvpool.master.config import EvictionMode
from kvpool.master.core import MetadataCore
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.segments import Segment
from kvpool.master.task_table import TaskDone, TaskTable
from kvpool.protocol.drain import DrainReply, DrainSegment, DrainStatus
from kvpool.protocol.messages import SegmentName

__all__ = ["DrainJob", "DrainTable"]

log = logging.getLogger(__name__)

_SCAN_SHARDS = 64
_KEEP_DONE = 600.0


@dataclass(slots=True)
class DrainJob:
    """One segment's drain (the `DrainReply` fields, and what the tick needs)."""

    segment: Segment
    started: float
    grace: float
    state: str = "scanning"
    objects: int = 0
    must_keep: int = 0
    moved: int = 0
    failed: int = 0
    leased: int = 0
    ended: float | None = None
    on_segment: list[ObjectMeta] = field(default_factory=list)
    to_move: list[tuple[ObjectMeta, Replica]] = field(default_factory=list)
    moving: int = 0
    scan: Iterator[None] | None = None

    @property
    def deadline(self) -> float:
        return self.started + self.grace

    def reply(self, now: float) -> DrainReply:
        end = self.ended if self.ended is not None else now
        return DrainReply(
            OK,
            self.state,
            self.objects,
            self.must_keep,
            self.moved,
            self.failed,
            self.leased,
            end - self.started,
            self.grace,
        )


class DrainTable:
    """The drains of one master (one event loop owns it)."""

    def __init__(self, core: MetadataCore, tasks: TaskTable) -> None:
        self._core = core
        self._tasks = tasks
        self._jobs: dict[SegmentName, DrainJob] = {}

    @property
    def active(self) -> bool:
        """A drain runs, or one restored from the log waits to be adopted."""
        jobs = self._jobs
        if any(j.ended is None for j in jobs.values()):
            return True
        return any(name not in jobs for name in self._core.draining)

    def jobs(self) -> list[DrainJob]:
        return list(self._jobs.values())

    # ------------------------------------------------------------------ requests

    def drain_segment(self, req: DrainSegment) -> DrainReply:
        now = self._core.clock()
        self._adopt_pending(now)
        job = self._jobs.get(req.name)
        if job is not None and job.ended is None:
            return job.reply(now)
        seg = self._core.segments.get(req.name)
        if seg is None:
            return DrainReply(SEGMENT_NOT_FOUND)
        if req.grace_ms < 0:
            return DrainReply(INVALID_PARAMS)
        core = self._core
        core.segments.drain(seg)
        job = DrainJob(seg, now, req.grace_ms / 1000.0)
        job.scan = self._scan(job)
        self._jobs[req.name] = job
        core.draining[req.name] = (job.deadline, job.grace)
        if core.journal is not None:
            core.journal.drain(seg, job.deadline, job.grace)
        log.info("draining segment %s (grace %.1f s)", req.name, job.grace)
        return job.reply(now)

    def _adopt_pending(self, now: float) -> None:
        if len(self._core.draining) > sum(1 for j in self._jobs.values() if j.ended is None):
            self.adopt(now)

    def adopt(self, now: float) -> None:
        """Start a job for each drain the metadata holds without one (restored from the log
        by a restart or a promotion: `durable.build`), ending when its grace was to end."""
        core = self._core
        for name, (deadline, grace) in list(core.draining.items()):
            job = self._jobs.get(name)
            if job is not None and job.ended is None:
                continue
            seg = core.segments.get(name)
            if seg is None or not seg.draining:
                del core.draining[name]
                continue
            job = DrainJob(seg, deadline - grace, grace)
            job.scan = self._scan(job)
            self._jobs[name] = job
            log.info(
                "resuming the drain of segment %s (%.1f s of its %.1f s grace left)",
                name,
                max(0.0, deadline - now),
                grace,
            )

    def drain_status(self, req: DrainStatus) -> DrainReply:
        self._adopt_pending(self._core.clock())
        job = self._jobs.get(req.name)
        if job is None:
            return DrainReply(OBJECT_NOT_FOUND)
        return job.reply(self._core.clock())

    # ------------------------------------------------------------------ the tick

    def tick(self) -> None:
        """One step of every running drain (the server calls it while `active`)."""
        now = self._core.clock()
        self._adopt_pending(now)
        for name, job in list(self._jobs.items()):
            if job.ended is not None:
                if now - job.ended > _KEEP_DONE:
                    del self._jobs[name]
                continue
            if not job.segment.alive:
                self._end(job, "aborted", now)
                continue
            if job.segment.silent and now < job.deadline:
                # Its owner is away (a drain resumed by a new leader before the node
                # remounted, or a node that missed its pings): nothing can be copied out.
                continue
            if job.state == "scanning":
                assert job.scan is not None
                if next(job.scan, True) is True:
                    job.scan = None
                    job.state = "moving"
            if job.state == "moving":
                self._move(job, now)
            if job.state == "waiting_leases":
                on = [o for o in job.on_segment if _replica_on(o, job.segment) is not None]
                job.leased = sum(1 for o in on if o.lease_deadline > now)
                if job.leased == 0 or now >= job.deadline:
                    self._core.unmount_segment(job.segment)
                    self._end(job, "done", now)

    def _scan(self, job: DrainJob) -> Iterator[None]:
        """Find the objects on the segment, a few shards per step (yields between steps)."""
        index = self._core.index
        seg = job.segment
        pool_mode = self._core.config.eviction_mode is EvictionMode.POOL
        now = self._core.clock()
        steps = 0
        for tenant in index.tenants():
            t = index.tenant(tenant)
            if t is None:
                continue
            for shard in t.shards:
                for obj in list(shard.values()):
                    r = _replica_on(obj, seg)
                    if r is None:
                        continue
                    job.objects += 1
                    job.on_segment.append(obj)
                    if _must_keep(obj, r, now, pool_mode):
                        job.must_keep += 1
                        job.to_move.append((obj, r))
                steps += 1
                if steps % _SCAN_SHARDS == 0:
                    yield None

    def _move(self, job: DrainJob, now: float) -> None:
        waiting: list[tuple[ObjectMeta, Replica]] = []
        for obj, r in job.to_move:
            if self._core.index.get(obj.tenant, obj.key) is not obj or r not in obj.replicas:
                job.must_keep -= 1  # removed or moved away by someone else meanwhile
                continue
            if now >= job.deadline:
                job.failed += 1
                continue
            if self._tasks.has_task(obj) or not self._tasks.swap_out(
                obj, r, 1.0, self._on_done(job, obj, r)
            ):
                waiting.append((obj, r))
            else:
                job.moving += 1
        job.to_move = waiting
        if waiting and job.moving == 0 and not self._may_receive(job.segment):
            # Nowhere to move to (the last segment of the pool): waiting cannot help.
            job.failed += len(waiting)
            job.to_move = waiting = []
        if not waiting and job.moving == 0:
            job.state = "waiting_leases"
        elif now >= job.deadline and job.moving == 0:
            job.failed += len(waiting)
            job.to_move = []
            job.state = "waiting_leases"

    def _may_receive(self, seg: Segment) -> bool:
        """Whether a segment other than `seg` serves, or may serve again soon (a silent one:
        after a failover every node remounts within a few pings)."""
        segments = self._core.segments
        if segments.live:
            return True
        return any(s is not seg and s.silent and not s.draining for s in segments.mounted())

    def _on_done(self, job: DrainJob, obj: ObjectMeta, r: Replica) -> TaskDone:
        def done(ok: bool) -> None:
            job.moving -= 1
            if ok:
                job.moved += 1
            elif job.ended is None:
                job.to_move.append((obj, r))  # tried again next tick, until the grace ends

        return done

    def _end(self, job: DrainJob, state: str, now: float) -> None:
        job.state = state
        job.ended = now
        if self._core.draining.get(job.segment.name) is not None:
            del self._core.draining[job.segment.name]
        job.on_segment = []
        job.to_move = []
        log.info(
            "drain of %s %s: %d objects, %d kept by moving, %d failed, %.1f s",
            job.segment.name,
            state,
            job.objects,
            job.moved,
            job.failed,
            now - job.started,
        )


def _replica_on(obj: ObjectMeta, seg: Segment) -> Replica | None:
    for r in obj.replicas:
        if r.segment is seg:
            return r
    return None


def _must_keep(obj: ObjectMeta, r: Replica, now: float, pool_mode: bool) -> bool:
    if not obj.complete:
        return False
    if obj.hard_pin:
        return True
    soft = obj.soft_pin_deadline
    if soft is not None and soft > now:
        return True
    if pool_mode:
        return not any(o is not r and o.readable() for o in obj.replicas)
    return False
