"""The master service: every rule about objects, replicas, segments and clients, as a plain class.

`MasterService` is driven by request Structs (`kvpool.protocol.messages`) and answers reply
Structs; it does no I/O and reads time only from the injected `clock`, so unit tests call it
directly and move time by hand. `kvpool.master.server` puts it behind an `RpcServer` and runs its
background work (`check_liveness`, `release_stale`, `sweep_dead`, the reclaim tick). One event
loop owns it: nothing here locks, and nothing here may block.

It is assembled by composition. The state has one owner each:

* `MetadataCore` (`core.py`): objects, segments, clients, placement, parked ranges, clock; the
  only code that changes them, through named operations;
* `TaskTable` (`task_table.py`) and `ArenaTable` (`arena_table.py`): replica tasks and arenas,
  each told by the core (`MetadataObserver`) when objects, segments or clients go;
* `PutPlanner` (`planner.py`): validates puts and rules whether a held key may be taken.

The request handlers hold references to those: `WritePath` (`writes.py`), `ReadPath`
(`reads.py`), `AdminPath` (`admin.py`), `TaskPath` (`tasks.py`), `ArenaPath` (`arenas.py`).
This module builds them, maps each request type to its handler, and implements
`hooks.ReclaimTarget` for the reclaim hooks.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import xxhash

from kvpool.master.admin import AdminPath, KeyPattern
from kvpool.master.arena_table import Arena, ArenaTable
from kvpool.master.arenas import ArenaPath
from kvpool.master.config import MasterConfig
from kvpool.master.core import MetadataCore
from kvpool.master.drain import DrainTable
from kvpool.master.durable import Durability, Replay, build, state_records
from kvpool.master.hooks import NoopReclaimHooks, ReclaimHooks
from kvpool.master.liveness import ClientTable
from kvpool.master.metadata import ObjectIndex, ObjectMeta, Replica
from kvpool.master.oplog import Journal, OpLog, Rec
from kvpool.master.parking import ParkedRanges
from kvpool.master.planner import PutPlanner
from kvpool.master.quota import TenantQuotas
from kvpool.master.reads import ReadPath
from kvpool.master.repair import RepairQueue
from kvpool.master.segments import SegmentTable
from kvpool.master.task_table import TaskDone, TaskTable
from kvpool.master.tasks import TaskPath
from kvpool.master.tier_config import OffloadPolicy
from kvpool.master.tiers import TierManager
from kvpool.master.writes import WritePath
from kvpool.protocol.drain import DrainSegment, DrainStatus
from kvpool.protocol.messages import (
    BatchExistKey,
    BatchGetLocations,
    BatchGetReplicaList,
    BatchPutCommit,
    BatchPutEnd,
    BatchPutRevoke,
    BatchPutStart,
    BatchRemove,
    BatchReplicaClear,
    BatchUpsertStart,
    ClientId,
    CreateCopyTask,
    CreateMoveTask,
    Echo,
    ExistKey,
    FetchTasks,
    FetchTasksReply,
    GetReplicaList,
    GetSegment,
    GetSize,
    MarkTaskComplete,
    Message,
    MountSegment,
    Ping,
    PutCommit,
    PutEnd,
    PutRevoke,
    PutStart,
    QueryTask,
    RegisterDiskReplicas,
    ReleaseArenas,
    ReMountSegment,
    Remove,
    RemoveAll,
    RemoveByRegex,
    ReportBadReplica,
    ReserveArena,
    Stats,
    StatsReply,
    TenantId,
    UnmountSegment,
    UpsertStart,
)

__all__ = ["MasterService"]


class MasterService:
    """All metadata of one pool and the rules that change it (one event loop owns it).

    Implements `ReclaimTarget` for the reclaim hooks.
    """

    def __init__(
        self,
        config: MasterConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        hooks: ReclaimHooks | None = None,
        open_data_dir: bool = True,
    ) -> None:
        """`open_data_dir` False leaves `config.data_dir` closed until `open_data_dir()` (an
        HA master opens it when it starts to lead)."""
        self._config = config if config is not None else MasterConfig()
        self._hooks: ReclaimHooks = hooks if hooks is not None else NoopReclaimHooks()
        core = self._core = MetadataCore(self._config, clock, self._hooks, ParkedRanges())
        self._tasks = TaskTable(core)
        self._arenas = ArenaTable(core)
        # Arenas first: on an unmount they collect the ranges parked there for late writers
        # before a failing task parks any more (the order the rules were written in).
        core.observe(self._arenas)
        core.observe(self._tasks)
        # After the tasks: a copy that fails with its object reports to the queue first.
        self._repair = RepairQueue(core, self._tasks)
        core.observe(self._repair)
        core.on_short = self._repair.note
        planner = self._planner = PutPlanner(
            self._config, core.index, core.clients, core.placement.strategy
        )
        # A put over quota first evicts its tenant's own objects (cache mode, reclaim on).
        planner.reclaim_tenant = self._hooks.reclaim_tenant
        self._writes = WritePath(core, planner, self._tasks)
        self._reads = ReadPath(core)
        self._tiers = TierManager(core, self._tasks, self._config.tiers)
        self._reads.on_disk_read = self._tiers.note_read
        if self._config.tiers.offload_policy is OffloadPolicy.EAGER or self._tiers.dfs is not None:
            # Only an eager offload and the DFS check want each completed object (a call per
            # put otherwise).
            core.on_complete = self._tiers.note_complete
        core.retry_hint = self._tiers.retry_hint
        core.on_disk_free = self._tiers.note_disk_free
        if self._tiers.dfs is not None:
            self._writes.dfs_replica = self._tiers.dfs_replica
        self._admin = AdminPath(core, self._tasks, self._arenas, self._repair)
        self._task_path = TaskPath(core, self._tasks, self._repair)
        self._arena_path = ArenaPath(core, planner, self._arenas)
        self._drains = DrainTable(core, self._tasks)
        w, r, a, t, ar = self._writes, self._reads, self._admin, self._task_path, self._arena_path
        self._handlers: dict[type[Any], Callable[[Any], Message]] = {
            Echo: a.echo,
            Ping: a.ping,
            MountSegment: a.mount_segment,
            ReMountSegment: a.remount_segment,
            UnmountSegment: a.unmount_segment,
            GetSegment: a.get_segment,
            PutStart: w.put_start,
            UpsertStart: w.upsert_start,
            BatchPutStart: w.batch_put_start,
            BatchUpsertStart: w.batch_upsert_start,
            PutEnd: w.put_end,
            BatchPutEnd: w.batch_put_end,
            PutRevoke: w.put_revoke,
            BatchPutRevoke: w.batch_put_revoke,
            GetReplicaList: r.get_replica_list,
            BatchGetReplicaList: r.batch_get_replica_list,
            BatchGetLocations: r.batch_get_locations,
            ExistKey: r.exist_key,
            BatchExistKey: r.batch_exist_key,
            GetSize: r.get_size,
            Remove: a.remove,
            BatchRemove: a.batch_remove,
            RemoveAll: a.remove_all,
            RemoveByRegex: a.remove_by_regex,
            Stats: a.stats,
            CreateCopyTask: t.create_copy_task,
            CreateMoveTask: t.create_move_task,
            QueryTask: t.query_task,
            FetchTasks: t.fetch_tasks,
            MarkTaskComplete: t.mark_task_complete,
            BatchReplicaClear: t.batch_replica_clear,
            ReportBadReplica: t.report_bad_replica,
            ReserveArena: ar.reserve_arena,
            ReleaseArenas: ar.release_arenas,
            PutCommit: ar.put_commit,
            BatchPutCommit: ar.batch_put_commit,
            DrainSegment: self._drains.drain_segment,
            DrainStatus: self._drains.drain_status,
            RegisterDiskReplicas: self._tiers.register,
        }
        self._handlers[FetchTasks] = self._fetch_tasks
        self._hooks.attach(self)
        #: The data directory's log and snapshots (None without `data_dir`).
        self.durable: Durability | None = None
        if self._config.data_dir is not None and open_data_dir:
            self.open_data_dir()

    def _fetch_tasks(self, req: FetchTasks) -> FetchTasksReply:
        """FetchTasks, with the disk-tier ranges of the client freed since its last fetch."""
        reply = self._task_path.fetch_tasks(req)
        if reply.code == 0:
            self._tiers.note_fetch(req.client_id, req.dfs)  # who may promote from DFS files
            freed = self._tiers.take_freed(req.client_id)
            if freed:
                reply.disk_freed = freed
        return reply

    # ------------------------------------------------------------------ durability, HA

    def open_data_dir(self) -> Durability:
        """Load `config.data_dir` (restart: snapshot + logs) and log every change there."""
        assert self._config.data_dir is not None and self.durable is None
        tiers = self._tiers  # tiers: the DFS segment, and who learns of restored replicas
        self.durable = Durability(
            self._core,
            self._config.data_dir,
            self._config.fsync_interval,
            self._arenas.lent,
            dfs=None if tiers.dfs is None else tiers.dfs.segment,
            restored=tiers.restored,
        )
        return self.durable

    def journal_to(self, oplog: OpLog) -> None:
        """Log every change into `oplog` (an HA leader without a data directory: a log with
        no file whose flushes feed the standbys)."""
        self._core.journal = Journal(oplog, self._core.clock, time.time)

    def load(self, state: Replay) -> None:
        """Fill the (empty) metadata from a standby's copy, as a restart does
        (`durable.build`: every segment silent until its node remounts it)."""
        # As for a restart (`Durability`): a million new acyclic records, no collections.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            dfs = None if self._tiers.dfs is None else self._tiers.dfs.segment
            build(self._core, state, time.time(), dfs, self._tiers.restored)
        finally:
            if was_enabled:
                gc.enable()

    def state_records(self) -> Iterator[Rec]:
        """The metadata as records (a standby's bootstrap snapshot); needs a journal."""
        journal = self._core.journal
        assert journal is not None
        return state_records(self._core, journal.to_wall, self._arenas.lent)

    def handle(self, request: Any) -> Message:
        """The reply to `request` (any member of `messages.Request`)."""
        return self._handlers[type(request)](request)

    @property
    def handlers(self) -> dict[type[Any], Callable[[Any], Message]]:
        return self._handlers

    # ------------------------------------------------------------------ state, for reading

    @property
    def config(self) -> MasterConfig:
        return self._config

    @property
    def index(self) -> ObjectIndex:
        return self._core.index

    @property
    def segments(self) -> SegmentTable:
        return self._core.segments

    @property
    def clients(self) -> ClientTable:
        return self._core.clients

    @property
    def hooks(self) -> ReclaimHooks:
        return self._hooks

    @property
    def view_version(self) -> int:
        return self._core.view_version

    @property
    def sweep_needed(self) -> bool:
        """A segment went away since the last `sweep_dead`: the server should run it."""
        return self._core.sweep_needed

    @property
    def arena_lease(self) -> float:
        """Seconds a request naming an arena keeps it its client's."""
        return self._arenas.lease

    def arenas_of(self, client_id: ClientId) -> list[Arena]:
        """The client's live arenas (for stats and tests)."""
        return self._arenas.arenas_of(client_id)

    def arena_stats(self) -> tuple[int, int]:
        """(arenas, bytes they hold)."""
        return self._arenas.stats()

    def parked(self) -> list[tuple[Replica, int]]:
        """Replicas (with their object size) whose ranges stay allocated until their release
        time (preempted or force-removed writes, expired arenas, failed tasks' targets)."""
        return self._core.parked.replicas()

    def shard_hash(self, tenant: str, key: str) -> int:
        """The raw 64-bit hash behind `shard_of` (exposed for tests of its stability)."""
        seed = xxhash.xxh3_64_intdigest(tenant.encode())
        return int(xxhash.xxh3_64_intdigest(key.encode(), seed))

    # ------------------------------------------------------------------ the monitor's work

    def check_liveness(self) -> list[ClientId]:
        """`expire_clients`, unless the master's own loop stalled (see `AdminPath`)."""
        return self._admin.check_liveness()

    def expire_clients(self) -> list[ClientId]:
        """Silence clients without a ping for `client_ttl`, drop those without one for
        `client_dead_ttl`; answers the ids dropped."""
        return self._admin.expire_clients()

    def expire_client(self, client_id: ClientId) -> None:
        """Unmount the client's segments, preempt its in-flight PutStarts, forget it."""
        self._core.expire_client(client_id)

    def release_stale(self) -> int:
        """Revoke stale PutStarts, free parked ranges whose time came, fail overdue tasks,
        release idle arenas; answers how many things were released."""
        return self._admin.release_stale()

    def sweep_dead(self) -> Iterator[int]:
        """Drop replicas of unmounted segments from the metadata, in steps (`MetadataCore`)."""
        return self._core.sweep_dead()

    def repair_tick(self) -> int:
        """Start due repair copies (`RepairQueue.tick`); answers how many started."""
        return self._repair.tick(self._core.clock()) + self._tiers.tick()

    @property
    def tiers(self) -> TierManager:
        """Offload, promotion and disk registration (for stats and tests)."""
        return self._tiers

    @property
    def drains(self) -> DrainTable:
        """Graceful drains of segments (`drain.py`); the server ticks it while one runs."""
        return self._drains

    @property
    def repair(self) -> RepairQueue:
        """The replica repair queue (for stats and tests)."""
        return self._repair

    # ------------------------------------------------------------------ requests by name

    def stats(self, req: Stats) -> StatsReply:
        return self._admin.stats(req)

    @property
    def quotas(self) -> TenantQuotas | None:
        """The tenant quotas in force (None: none)."""
        return self._planner.quotas

    def set_quotas(self, quotas: TenantQuotas | None) -> None:
        """Apply `quotas` to every put from now on (None: no limits); `kvpool.master.quota`."""
        self._planner.quotas = quotas
        self._admin.quotas = quotas
        self._tiers.quotas = quotas  # no promotion or eager offload past a quota
        self._task_path.quotas = quotas  # no CreateCopyTask past a quota

    def remove_by_regex(self, req: RemoveByRegex) -> Message:
        return self._admin.remove_by_regex(req)

    @staticmethod
    def compile_pattern(pattern: str) -> KeyPattern | None:
        """A client's RemoveByRegex pattern, compiled; None when it is not a valid one."""
        return AdminPath.compile_pattern(pattern)

    def remove_matching(
        self, tenant: TenantId, rx: KeyPattern | None, force: bool
    ) -> Iterator[Message | None]:
        """RemoveAll / RemoveByRegex in chunks (`AdminPath.remove_matching`)."""
        return self._admin.remove_matching(tenant, rx, force)

    # ------------------------------------------------------------------ ReclaimTarget

    def now(self) -> float:
        return self._core.clock()

    def memory_usage(self) -> tuple[int, int]:
        return self._core.segments.capacity()

    def memory_pressure(self) -> tuple[int, int]:
        best, best_ratio = (0, 0), -1.0
        for seg in self._core.segments.live:
            a = seg.allocator
            ratio = a.allocated / a.capacity if a.capacity else 0.0
            if ratio > best_ratio:
                best, best_ratio = (a.capacity, a.allocated), ratio
        return best

    def evictable(self, obj: ObjectMeta, now: float) -> bool:
        return (
            obj.complete
            and not obj.hard_pin
            and now >= obj.lease_deadline
            and not self._tasks.has_task(obj)
            and self._core.index.get(obj.tenant, obj.key) is obj
        )

    def evict(self, obj: ObjectMeta) -> int:
        return self._tiers.evict(obj)

    def evict_replica(self, obj: ObjectMeta, replica: Replica) -> int:
        if replica not in obj.replicas:
            return 0
        return self._core.drop_replica(obj, replica)

    def has_task(self, obj: ObjectMeta) -> bool:
        return self._tasks.has_task(obj)

    def swap_out(
        self, obj: ObjectMeta, replica: Replica, low_watermark: float, on_done: TaskDone
    ) -> bool:
        if self._tasks.swap_out(obj, replica, low_watermark, on_done):
            return True
        return self._tiers.move_to_disk(obj, replica, on_done)

    def move_away(
        self,
        moves: Sequence[tuple[ObjectMeta, Replica, TaskDone]],
        keep_free: Sequence[tuple[int, int]],
    ) -> bool:
        cfg = self._config
        low = max(0.0, cfg.eviction_high_watermark_ratio - cfg.eviction_ratio)
        return self._tasks.move_away(moves, keep_free, low)

    def largest_free(self) -> int:
        return max((s.allocator.largest_free() for s in self._core.segments.live), default=0)
