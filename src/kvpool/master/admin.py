"""Segments, client liveness, removal and stats: the master's non-object-write requests.

Mount and ReMount register the client and are idempotent; Unmount checks the owner. The server's
monitor calls `check_liveness` (`expire_clients`, not blaming the clients for a stall of the
master's own loop), `release_stale` and `sweep_dead`. Remove refuses leased or in-flight objects
unless forced; RemoveAll and RemoveByRegex run over a snapshot of the index, in chunks
(`remove_matching` yields between them so the server can give the loop a turn).

RemoveByRegex patterns come from clients, so they are matched with the `regex` package and a
time limit (`re` cannot be interrupted: `^(a|aa)+$` against a 40-character key runs for
minutes): each chunk of keys may spend `regex_match_budget` in matching, and every search gets
what is left of it as its timeout. A request that runs out stops there and answers
INVALID_PARAMS with the count of the objects it had removed already (they stay removed). The
limit is per chunk, not per request, because a per-request budget would refuse benign patterns
on large tenants: a search with a timeout costs about 2.5 us per key (0.3 without), so 100 ms
runs out after some 40,000 keys.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Iterator
from typing import Protocol

import regex  # type: ignore[import-untyped]

from kvpool.master.liveness import ClientRecord
from kvpool.master.metadata import (
    ObjectMeta,
    Replica,
)
from kvpool.master.segments import Segment
from kvpool.master.state import (
    _HAS_LEASE,
    _HAS_TASK,
    _ILLEGAL_CLIENT,
    _INVALID_PARAMS,
    _NOT_FOUND,
    _NOT_READY,
    _OK,
    _OK_REPLY,
    _REMOVE_CHUNK,
    _SEG_EXISTS,
    _SEG_NOT_FOUND,
    ServiceState,
)
from kvpool.protocol.messages import (
    BatchRemove,
    BatchReply,
    ClientId,
    ClientStatus,
    CountReply,
    Echo,
    EchoReply,
    GetSegment,
    Message,
    MountSegment,
    Ping,
    PingReply,
    ReMountSegment,
    Remove,
    RemoveAll,
    RemoveByRegex,
    Reply,
    SegmentInfo,
    SegmentReply,
    Stats,
    StatsReply,
    TenantId,
    UnmountSegment,
)

__all__ = ["AdminPath", "KeyPattern"]

log = logging.getLogger(__name__)


class KeyPattern(Protocol):
    """What RemoveByRegex needs of a compiled pattern (a `regex.Pattern`)."""

    def search(self, string: str, *, timeout: float | None = None) -> object | None: ...


class AdminPath(ServiceState):
    """Segments, liveness, removal, stats, ping and echo."""

    def echo(self, req: Echo) -> EchoReply:
        return EchoReply(req.payload)

    def ping(self, req: Ping) -> PingReply:
        if not req.client_id:
            return PingReply(_INVALID_PARAMS, ClientStatus.UNDEFINED, self.view_version)
        if self.clients.ping(req.client_id, self._clock()):
            queue = self._task_queues.get(req.client_id) if self._task_queues else None
            if queue:
                return PingReply(_OK, ClientStatus.OK, self.view_version, len(queue))
            return PingReply(_OK, ClientStatus.OK, self.view_version)
        return PingReply(_OK, ClientStatus.NEED_REMOUNT, self.view_version)

    def get_segment(self, req: GetSegment) -> SegmentReply:
        seg = self.segments.get(req.name)
        if seg is None:
            return SegmentReply(_SEG_NOT_FOUND)
        return SegmentReply(_OK, seg.info())

    def stats(self, req: Stats) -> StatsReply:
        now = self._clock()
        cap, used = self.segments.capacity()
        return StatsReply(
            _OK,
            [s.stats() for s in self.segments.live],
            self.clients.stats(now),
            len(self._index),
            sum(len(v) for v in self.clients.in_flight.values()),
            cap,
            used,
            now - self._started,
            len(self._task_of),
            *self.arena_stats(),
        )

    def mount_segment(self, req: MountSegment) -> Reply:
        if not req.client_id:
            return Reply(_INVALID_PARAMS)
        rec = self.clients.register(req.client_id, req.host_id, self._clock())
        return Reply(self._mount(rec, req.segment))

    def remount_segment(self, req: ReMountSegment) -> Reply:
        if not req.client_id:
            return Reply(_INVALID_PARAMS)
        rec = self.clients.register(req.client_id, req.host_id, self._clock())
        code = _OK
        for info in req.segments:
            c = self._mount(rec, info)
            if c != _OK and code == _OK:
                code = c  # the first failure is the answer; the others still get mounted
        return Reply(code)

    def _mount(self, rec: ClientRecord, info: SegmentInfo) -> int:
        if not info.name or info.size < self._config.alignment:
            return _INVALID_PARAMS
        seg = self.segments.get(info.name)
        if seg is not None:
            if seg.same_mount(info, rec.client_id, rec.host_id):
                return _OK  # idempotent: the same segment mounted again
            return _SEG_EXISTS
        new = self.segments.mount(info, rec.client_id, rec.host_id)
        if self._ghosts:
            self._restore_ghosts(new)
        rec.segments[info.name] = None
        log.info("mounted segment %s (%d bytes) of client %s", info.name, info.size, rec.client_id)
        return _OK

    def unmount_segment(self, req: UnmountSegment) -> Reply:
        seg = self.segments.get(req.name)
        if seg is None:
            return _OK_REPLY  # idempotent, as Mooncake: unmounting what is gone succeeds
        if seg.client_id != req.client_id:
            return Reply(_ILLEGAL_CLIENT)
        self._unmount(seg)
        return _OK_REPLY

    def _unmount(self, seg: Segment) -> None:
        self.segments.unmount(seg)
        rec = self.clients.get(seg.client_id)
        if rec is not None:
            rec.segments.pop(seg.name, None)
        self.sweep_needed = True
        self._drop_arenas_on(seg)
        if self._task_of:
            self._fail_tasks_on_segment(seg)
        log.info("unmounted segment %s of client %s", seg.name, seg.client_id)

    def check_liveness(self) -> list[ClientId]:
        """The monitor's liveness step: `expire_clients`, except that a gap since the previous
        step well beyond `monitor_interval` (by more than half of `client_ttl`) means the
        master's loop was stalled (a long request, a pause of the process), not that its
        clients fell silent: their pings were waiting unread. Every deadline is then pushed
        forward by the stall before anyone is expired."""
        now = self._clock()
        last, self._last_liveness = self._last_liveness, now
        if last is not None:
            # The stall is what the gap exceeds the monitor's own period by. Only a stall that
            # matters next to the TTL postpones anything: ordinary scheduling jitter on a busy
            # machine must not, or with a TTL near the period a silent client would be
            # postponed on every tick and never expire.
            stall = now - last - self._config.monitor_interval
            if stall > self._config.client_ttl / 2:
                log.warning("liveness monitor stalled for %.1f s: deadlines postponed", stall)
                self.clients.postpone(stall)
        return self.expire_clients()

    def expire_clients(self) -> list[ClientId]:
        """Expire every client silent for `client_ttl`; answers their ids."""
        now = self._clock()
        gone: list[ClientId] = []
        for rec in self.clients.expired(now):
            self.expire_client(rec.client_id)
            gone.append(rec.client_id)
        return gone

    def expire_client(self, client_id: ClientId) -> None:
        """Unmount the client's segments, preempt its in-flight PutStarts, forget it.

        A client that fell silent may still be writing into other nodes' segments: the ranges
        of its unfinished puts are parked until their release time, as a stale PutStart's
        are, so no other object is placed where a late write could land."""
        rec = self.clients.get(client_id)
        if rec is not None:
            for name in list(rec.segments):
                seg = self.segments.get(name)
                if seg is not None and seg.client_id == client_id:
                    self._unmount(seg)
        for obj in self.clients.in_flight_of(client_id):
            self._preempt(obj)
        self._expire_arenas(client_id)
        if self._task_of:
            self._fail_tasks_of_client(client_id)
        self.clients.forget(client_id)
        log.warning("client %s expired: segments unmounted, in-flight puts preempted", client_id)

    def release_stale(self) -> int:
        """Revoke PutStarts older than `put_start_release_timeout` and free parked replicas
        whose time has come; answers how many objects or parked sets were released."""
        now = self._clock()
        limit = now - self._config.put_start_release_timeout
        released = 0
        stale = [
            obj
            for bucket in self.clients.in_flight.values()
            for obj in bucket
            if obj.put_start_time <= limit
        ]
        for obj in stale:
            log.info("releasing stale PutStart of %r", obj.key)
            self._revoke(obj)
            released += 1
        self.clients.prune()
        parked = self._parked
        while parked and parked[0][0] <= now:
            _, _, size, replicas = heapq.heappop(parked)
            for r in replicas:
                self._free_replica(r, size)
            released += 1
        if self._task_of or self._tasks_ended:
            released += self._expire_tasks()
        if self._arenas or self._ghosts:
            released += self._expire_idle_arenas()
        return released

    def parked(self) -> list[tuple[Replica, int]]:
        """Replicas (with their object size) of preempted or force-removed PutStarts, whose
        ranges stay allocated until their release time."""
        return [(r, size) for _, _, size, reps in self._parked for r in reps]

    def sweep_dead(self) -> Iterator[int]:
        """Drop replicas on unmounted segments from the metadata, and the objects left with
        none, `sweep_batch` objects per step (the server yields to the loop between steps);
        each step yields the number of objects removed so far."""
        self.sweep_needed = False
        removed = 0
        batch = self._config.sweep_batch
        objs = self._index.snapshot()
        for i in range(0, len(objs), batch):
            for obj in objs[i : i + batch]:
                reps = obj.replicas
                if all(r.segment.alive for r in reps):
                    continue
                live = tuple(r for r in reps if r.segment.alive)
                if live:
                    obj.replicas = live
                elif self._index.get(obj.tenant, obj.key) is obj:
                    obj.replicas = ()
                    self._drop(obj)
                    removed += 1
            yield removed

    def remove(self, req: Remove) -> Reply:
        code = self._remove_one(req.tenant, req.key, req.force, self._clock())
        return _OK_REPLY if code == _OK else Reply(code)

    def batch_remove(self, req: BatchRemove) -> BatchReply:
        now = self._clock()
        rm = self._remove_one
        tenant, force = req.tenant, req.force
        return BatchReply([rm(tenant, k, force, now) for k in req.keys])

    def _remove_one(self, tenant: TenantId, key: str, force: bool, now: float) -> int:
        obj = self._lookup(tenant, key)
        if obj is None:
            return _NOT_FOUND
        if not force:
            if now < obj.lease_deadline:
                return _HAS_LEASE
            if not obj.complete:
                return _NOT_READY
            if self._task_of and obj in self._task_of:
                return _HAS_TASK
        self._remove_obj(obj)  # (forced: a task on it fails, its destination is freed)
        return _OK

    def _remove_obj(self, obj: ObjectMeta) -> None:
        if obj.complete:
            self._free_and_drop(obj)
            return
        # Forced removal of a write in progress: its writer may still be writing.
        self._park(obj)
        self.clients.drop_in_flight(obj)
        self._drop(obj)

    def remove_all(self, req: RemoveAll) -> Message:
        return _drain(self.remove_matching(req.tenant, None, req.force))

    def remove_by_regex(self, req: RemoveByRegex) -> Message:
        rx = self.compile_pattern(req.pattern)
        if rx is None:
            return _count_reply(_INVALID_PARAMS, 0)
        return _drain(self.remove_matching(req.tenant, rx, req.force))

    @staticmethod
    def compile_pattern(pattern: str) -> KeyPattern | None:
        """A client's RemoveByRegex pattern, compiled; None when it is not a valid one."""
        try:
            rx: KeyPattern = regex.compile(pattern)
        except (regex.error, ValueError, TypeError, OverflowError):
            return None
        return rx

    def remove_matching(
        self, tenant: TenantId, rx: KeyPattern | None, force: bool
    ) -> Iterator[Message | None]:
        """Remove the tenant's objects whose key `rx` finds (all with None), skipping leased
        and in-flight ones unless `force`; yields None between chunks of work (the server
        gives the loop a turn there) and the `CountReply` last: INVALID_PARAMS, with what was
        removed so far, when matching overran `regex_match_budget` in a chunk."""
        if not tenant:
            yield _count_reply(_INVALID_PARAMS, 0)
            return
        objs = self._index.snapshot(tenant)
        count = 0
        budget = self._config.regex_match_budget
        clock = time.perf_counter  # matching costs real time, whatever the service's clock
        for i in range(0, len(objs), _REMOVE_CHUNK):
            now = self._clock()
            spent = 0.0
            for obj in objs[i : i + _REMOVE_CHUNK]:
                if rx is not None:
                    t0 = clock()
                    try:
                        found = rx.search(obj.key, timeout=max(budget - spent, 1e-6))
                    except TimeoutError:
                        log.warning(
                            "RemoveByRegex stopped: matching overran %g s per %d keys "
                            "(%d objects removed before)",
                            budget,
                            _REMOVE_CHUNK,
                            count,
                        )
                        yield _count_reply(_INVALID_PARAMS, count)
                        return
                    spent += clock() - t0
                    if found is None:
                        continue
                if self._index.get(obj.tenant, obj.key) is not obj:
                    continue  # removed or replaced meanwhile
                if not obj.has_live_replica():
                    # Already gone with its segments (the sweep had not reached it yet): not
                    # a removal of this request, as in Mooncake after ClearInvalidHandles.
                    self._forget_dead(obj)
                    continue
                if not force and (
                    now < obj.lease_deadline or not obj.complete or obj in self._task_of
                ):
                    continue
                self._remove_obj(obj)
                count += 1
            yield None
        yield _count_reply(_OK, count)


def _count_reply(code: int, count: int) -> Message:
    return CountReply(code, count)


def _drain(steps: Iterator[Message | None]) -> Message:
    """Run a chunked operation to its end in one go (the plain, synchronous path)."""
    last: Message | None = None
    for step in steps:
        if step is not None:
            last = step
    assert last is not None
    return last
