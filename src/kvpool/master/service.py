"""The master service: every rule about objects, replicas, segments and clients, as a plain class.

`MasterService` is driven by request Structs (`kvpool.protocol.messages`) and answers reply
Structs; it does no I/O and reads time only from the injected `clock`, so unit tests call it
directly and move time by hand. `kvpool.master.server` puts it behind an `RpcServer` and runs its
background work (`expire_clients`, `release_stale`, `sweep_dead`, the reclaim tick). One event
loop owns it: nothing here locks, and nothing here may block.

The rules live in the parts it is assembled from (each a `ServiceState` subclass):
`writes.WritePath` (the write lifecycle), `reads.ReadPath` (reads and leases),
`admin.AdminPath` (segments, liveness, removal, stats), `tasks.TaskPath` (replica copy and
move tasks, BatchReplicaClear, pool-mode swap-out) and `arenas.ArenaPath` (ReserveArena,
PutCommit: puts in one round trip). This module builds the state, maps each
request type to its handler, and implements `hooks.ReclaimTarget` for the reclaim hooks.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from kvpool.master.admin import AdminPath
from kvpool.master.arenas import ArenaPath
from kvpool.master.config import MasterConfig
from kvpool.master.hooks import NoopReclaimHooks, ReclaimHooks
from kvpool.master.liveness import ClientTable
from kvpool.master.metadata import (
    ObjectIndex,
    ObjectMeta,
    Replica,
)
from kvpool.master.placement import Placement
from kvpool.master.reads import ReadPath
from kvpool.master.segments import SegmentTable
from kvpool.master.tasks import TaskPath
from kvpool.master.writes import WritePath
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
    CreateCopyTask,
    CreateMoveTask,
    Echo,
    ExistKey,
    FetchTasks,
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
    ReleaseArenas,
    ReMountSegment,
    Remove,
    RemoveAll,
    RemoveByRegex,
    ReserveArena,
    Stats,
    UnmountSegment,
    UpsertStart,
)

__all__ = ["MasterService"]


class MasterService(ArenaPath, WritePath, ReadPath, AdminPath, TaskPath):
    """All metadata of one pool and the rules that change it (one event loop owns it).

    Implements `ReclaimTarget` for the reclaim hooks.
    """

    def __init__(
        self,
        config: MasterConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        hooks: ReclaimHooks | None = None,
    ) -> None:
        self._config = config if config is not None else MasterConfig()
        self._clock = clock
        self._hooks: ReclaimHooks = hooks if hooks is not None else NoopReclaimHooks()
        self._index = ObjectIndex(self._config.num_shards)
        self.segments = SegmentTable(self._config.alignment)
        self.clients = ClientTable(self._config.client_ttl)
        self._placement = Placement(
            self._config.allocation_strategy, random.Random(self._config.seed)
        )
        self._lease_ttl = self._config.default_kv_lease_ttl
        self._lease_ttl_ms = round(self._lease_ttl * 1000)
        self._discard_timeout = self._config.put_start_discard_timeout
        # Replicas of preempted or force-removed PutStarts: (release_at, seq, size, replicas).
        self._parked: list[tuple[float, int, int, tuple[Replica, ...]]] = []
        self._park_seq = 0
        self._started = clock()
        self.view_version = 1
        #: Set when a segment went away; the server then runs `sweep_dead`.
        self.sweep_needed = False
        self._last_liveness = None
        self._tasks = {}
        self._task_of = {}
        self._task_queues = {}
        self._tasks_ended = deque()
        self._arenas = {}
        self._arenas_of = {}
        self._ghosts = {}
        self._handlers: dict[type[Any], Callable[[Any], Message]] = {
            Echo: self.echo,
            Ping: self.ping,
            MountSegment: self.mount_segment,
            ReMountSegment: self.remount_segment,
            UnmountSegment: self.unmount_segment,
            GetSegment: self.get_segment,
            PutStart: self.put_start,
            UpsertStart: self.upsert_start,
            BatchPutStart: self.batch_put_start,
            BatchUpsertStart: self.batch_upsert_start,
            PutEnd: self.put_end,
            BatchPutEnd: self.batch_put_end,
            PutRevoke: self.put_revoke,
            BatchPutRevoke: self.batch_put_revoke,
            GetReplicaList: self.get_replica_list,
            BatchGetReplicaList: self.batch_get_replica_list,
            BatchGetLocations: self.batch_get_locations,
            ExistKey: self.exist_key,
            BatchExistKey: self.batch_exist_key,
            GetSize: self.get_size,
            Remove: self.remove,
            BatchRemove: self.batch_remove,
            RemoveAll: self.remove_all,
            RemoveByRegex: self.remove_by_regex,
            Stats: self.stats,
            CreateCopyTask: self.create_copy_task,
            CreateMoveTask: self.create_move_task,
            QueryTask: self.query_task,
            FetchTasks: self.fetch_tasks,
            MarkTaskComplete: self.mark_task_complete,
            BatchReplicaClear: self.batch_replica_clear,
            ReserveArena: self.reserve_arena,
            ReleaseArenas: self.release_arenas,
            PutCommit: self.put_commit,
            BatchPutCommit: self.batch_put_commit,
        }
        self._hooks.attach(self)

    def handle(self, request: Any) -> Message:
        """The reply to `request` (any member of `messages.Request`)."""
        return self._handlers[type(request)](request)

    @property
    def handlers(self) -> dict[type[Any], Callable[[Any], Message]]:
        return self._handlers

    @property
    def config(self) -> MasterConfig:
        return self._config

    @property
    def index(self) -> ObjectIndex:
        return self._index

    @property
    def hooks(self) -> ReclaimHooks:
        return self._hooks

    def now(self) -> float:
        return self._clock()

    def memory_usage(self) -> tuple[int, int]:
        return self.segments.capacity()

    def memory_pressure(self) -> tuple[int, int]:
        best, best_ratio = (0, 0), -1.0
        for seg in self.segments.live:
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
            and obj not in self._task_of
            and self._index.get(obj.tenant, obj.key) is obj
        )

    def evict(self, obj: ObjectMeta) -> int:
        return self._free_and_drop(obj)

    def evict_replica(self, obj: ObjectMeta, replica: Replica) -> int:
        if replica not in obj.replicas:
            return 0
        return self._evict_one_replica(obj, replica)
