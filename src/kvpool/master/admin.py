"""Segments, client liveness, removal and stats: the master's non-object-write requests.

Mount and ReMount register the client and are idempotent; Unmount checks the owner. The server's
monitor calls `check_liveness` (`expire_clients`, not blaming the clients for a stall of the
master's own loop), `release_stale` and `sweep_dead`. Remove refuses leased or in-flight objects
unless forced; RemoveAll and RemoveByRegex run over a snapshot of the index, in chunks
(`remove_matching` yields between them so the server can give the loop a turn).

RemoveByRegex patterns come from clients, so they are matched with the `regex` package and a
time limit (`re` cannot be interrupted, and `^(a|aa)+$` backtracks for a time exponential in
the key's length): each chunk of keys may spend `regex_match_budget` in matching, and every
search gets what is left of it as its timeout. A request that runs out stops there and answers
INVALID_PARAMS with the count of the objects it had removed already (they stay removed). The
limit is per chunk, not per request, because a search with a timeout costs several times one
without: a per-request budget would refuse benign patterns on large tenants (the master's
section of docs/architecture.md has the measured costs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Protocol

import regex  # type: ignore[import-untyped]

from kvpool.codes import (
    ILLEGAL_CLIENT,
    INVALID_PARAMS,
    OBJECT_HAS_LEASE,
    OBJECT_HAS_REPLICATION_TASK,
    OBJECT_NOT_FOUND,
    OK,
    REPLICA_IS_NOT_READY,
    SEGMENT_NOT_FOUND,
)
from kvpool.master.arena_table import ArenaTable
from kvpool.master.core import MetadataCore
from kvpool.master.metadata import Replica
from kvpool.master.quota import TenantQuotas
from kvpool.master.repair import RepairQueue
from kvpool.master.task_table import TaskTable
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
    RemountReply,
    ReMountSegment,
    Remove,
    RemoveAll,
    RemoveByRegex,
    Reply,
    SegmentReply,
    Stats,
    StatsReply,
    TenantId,
    TenantUsage,
    UnmountSegment,
)

__all__ = ["AdminPath", "KeyPattern"]

log = logging.getLogger(__name__)

_REMOVE_CHUNK = 5_000
_OK_REPLY = Reply(OK)


class KeyPattern(Protocol):
    """What RemoveByRegex needs of a compiled pattern (a `regex.Pattern`)."""

    def search(self, string: str, *, timeout: float | None = None) -> object | None: ...


class AdminPath:
    """Segments, liveness, removal, stats, ping and echo."""

    def __init__(
        self, core: MetadataCore, tasks: TaskTable, arenas: ArenaTable, repair: RepairQueue
    ) -> None:
        self._core = core
        self._tasks = tasks
        self._arenas = arenas
        self._repair = repair
        self._config = core.config
        self._clock = core.clock
        self._index = core.index
        #: When the monitor last ran `check_liveness` (None: not yet).
        self._last_liveness: float | None = None
        #: The tenant quotas in force, shown in Stats (None: none).
        self.quotas: TenantQuotas | None = None

    def echo(self, req: Echo) -> EchoReply:
        return EchoReply(req.payload)

    def ping(self, req: Ping) -> PingReply:
        if not req.client_id:
            return PingReply(INVALID_PARAMS, ClientStatus.UNDEFINED, self._core.view_version)
        version = self._core.view_version
        # A silent client (or one the master forgot) must remount: its segments come back
        # with their objects only if it names the same memory (docs/parts/reliability.md).
        if self._core.ping_client(req.client_id, self._clock()):
            pending = self._tasks.pending(req.client_id)
            if pending:
                return PingReply(OK, ClientStatus.OK, version, pending)
            return PingReply(OK, ClientStatus.OK, version)
        return PingReply(OK, ClientStatus.NEED_REMOUNT, version)

    def get_segment(self, req: GetSegment) -> SegmentReply:
        seg = self._core.segments.get(req.name)
        if seg is None:
            return SegmentReply(SEGMENT_NOT_FOUND)
        return SegmentReply(OK, seg.info())

    def stats(self, req: Stats) -> StatsReply:
        now = self._clock()
        core = self._core
        cap, used = core.segments.capacity()
        repair = self._repair
        return StatsReply(
            OK,
            [s.stats() for s in core.segments.live],
            core.clients.stats(now),
            len(self._index),
            sum(len(v) for v in core.clients.in_flight.values()),
            cap,
            used,
            now - core.started,
            self._tasks.active,
            *self._arenas.stats(),
            [s.stats() for s in core.segments.mounted() if s.silent],
            core.clients.stats(now, silent=True),
            repair.under_replicated,
            repair.queued,
            repair.in_flight,
            repair.done,
            repair.failed,
            tenants=self._tenant_usage(),
        )

    def _tenant_usage(self) -> list[TenantUsage]:
        used = self._index.tenant_bytes
        limits = self.quotas.limits if self.quotas is not None else {}
        return [
            TenantUsage(TenantId(name), used.get(name, 0), limits.get(name))
            for name in sorted(used.keys() | limits.keys())
        ]

    def mount_segment(self, req: MountSegment) -> Reply:
        if not req.client_id:
            return Reply(INVALID_PARAMS)
        rec = self._core.register_client(req.client_id, req.host_id, self._clock())
        return Reply(self._core.mount_segment(rec, req.segment))

    def remount_segment(self, req: ReMountSegment) -> Reply:
        """Register the client and mount its segments; a silent client's segments named
        with the same generation are restored with their objects, which a `RemountReply`
        lists (a plain `Reply` when none was: what a node that sends no generations, or
        one that never paused, always gets)."""
        if not req.client_id:
            return Reply(INVALID_PARAMS)
        core = self._core
        rec = core.register_client(req.client_id, req.host_id, self._clock())
        restored = core.revive_client(rec, req.segments) if rec.silent else []
        code = OK
        for info in req.segments:
            c = core.mount_segment(rec, info)
            if c != OK and code == OK:
                code = c  # the first failure is the answer; the others still get mounted
        return RemountReply(code, restored) if restored else Reply(code)

    def unmount_segment(self, req: UnmountSegment) -> Reply:
        seg = self._core.segments.get(req.name)
        if seg is None:
            return _OK_REPLY  # idempotent, as Mooncake: unmounting what is gone succeeds
        if seg.client_id != req.client_id:
            return Reply(ILLEGAL_CLIENT)
        self._core.unmount_segment(seg)
        return _OK_REPLY

    def check_liveness(self) -> list[ClientId]:
        """The monitor's liveness step: `expire_clients` (silence, then drop), except that a
        gap since the previous step well beyond `monitor_interval` (by more than half of
        `client_ttl`) means the master's loop was stalled (a long request, a pause of the
        process), not that its clients fell silent: their pings were waiting unread. Every
        deadline is then pushed forward by the stall before anyone is expired."""
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
                self._core.postpone_clients(stall)
        return self.expire_clients()

    def expire_clients(self) -> list[ClientId]:
        """Clients without a ping for `client_ttl` turn silent (kept, neither read nor
        written); those without one for `client_dead_ttl` are dropped. Answers the ids of
        the clients dropped."""
        now = self._clock()
        core = self._core
        silent, dead = core.clients.due(now)
        for rec in silent:
            core.silence_client(rec.client_id)
        gone: list[ClientId] = []
        for rec in dead:
            core.expire_client(rec.client_id)
            gone.append(rec.client_id)
        return gone

    def release_stale(self) -> int:
        """Revoke PutStarts older than `put_start_release_timeout`, free parked replicas whose
        time has come, fail overdue tasks and release idle arenas; answers how many objects,
        parked sets, tasks and arenas were released."""
        core = self._core
        now = self._clock()
        limit = now - self._config.put_start_release_timeout
        # A client that never registered (no ReMountSegment, no Ping) is no Store: its
        # PutStarts are released after the discard timeout, not the release timeout, so a
        # flood of them cannot hold the pool "processing" for long (docs/security.md).
        orphan_limit = now - self._config.put_start_discard_timeout
        known = core.clients.get
        released = 0
        stale = [
            obj
            for client_id, bucket in core.clients.in_flight.items()
            for obj in bucket
            if obj.put_start_time <= (limit if known(client_id) is not None else orphan_limit)
        ]
        for obj in stale:
            log.info("releasing stale PutStart of %r", obj.key)
            core.revoke(obj)
            released += 1
        core.prune_clients()
        released += core.release_parked(now)
        released += self._tasks.expire()
        released += self._arenas.expire_idle()
        return released

    def parked(self) -> list[tuple[Replica, int]]:
        """Replicas (with their object size) of preempted or force-removed PutStarts, whose
        ranges stay allocated until their release time."""
        return self._core.parked.replicas()

    def remove(self, req: Remove) -> Reply:
        code = self._remove_one(req.tenant, req.key, req.force, self._clock())
        return _OK_REPLY if code == OK else Reply(code)

    def batch_remove(self, req: BatchRemove) -> BatchReply:
        now = self._clock()
        rm = self._remove_one
        tenant, force = req.tenant, req.force
        return BatchReply([rm(tenant, k, force, now) for k in req.keys])

    def _remove_one(self, tenant: TenantId, key: str, force: bool, now: float) -> int:
        obj = self._core.lookup(tenant, key)
        if obj is None:
            return OBJECT_NOT_FOUND
        if not force:
            if now < obj.lease_deadline:
                return OBJECT_HAS_LEASE
            if not obj.complete:
                return REPLICA_IS_NOT_READY
            if self._tasks.blocks(obj):
                return OBJECT_HAS_REPLICATION_TASK
        self._core.remove_object(obj)  # (forced: a task on it fails, its destination is freed)
        return OK

    def remove_all(self, req: RemoveAll) -> Message:
        return _drain(self.remove_matching(req.tenant, None, req.force))

    def remove_by_regex(self, req: RemoveByRegex) -> Message:
        rx = self.compile_pattern(req.pattern)
        if rx is None:
            return _count_reply(INVALID_PARAMS, 0)
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
            yield _count_reply(INVALID_PARAMS, 0)
            return
        core = self._core
        has_task = self._tasks.blocks
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
                        yield _count_reply(INVALID_PARAMS, count)
                        return
                    spent += clock() - t0
                    if found is None:
                        continue
                if self._index.get(obj.tenant, obj.key) is not obj:
                    continue  # removed or replaced meanwhile
                if not obj.has_live_replica():
                    # Already gone with its segments (the sweep had not reached it yet): not
                    # a removal of this request, as in Mooncake after ClearInvalidHandles.
                    core.forget_dead(obj)
                    continue
                if not force and (now < obj.lease_deadline or not obj.complete or has_task(obj)):
                    continue
                core.remove_object(obj)
                count += 1
            yield None
        yield _count_reply(OK, count)


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
