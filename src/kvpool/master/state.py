"""The state shared by the parts of the master service, and the helpers they all use.

`MasterService` (`service.py`) is assembled from three parts, each a subclass of `ServiceState`
in a module of its own: `WritePath` (`writes.py`: PutStart, UpsertStart, PutEnd, PutRevoke),
`ReadPath` (`reads.py`: GetReplicaList, ExistKey, GetSize, leases) and `AdminPath`
(`admin.py`: segments, liveness, removal, stats). `ServiceState` declares the state they share
(built by `MasterService.__init__`) and the helpers every part needs: dropping an object,
freeing a replica, parking the ranges of a write that may still be in progress.

Objects whose replicas all sit on unmounted segments are gone: every lookup drops such an
object on sight (O(replicas)), and `AdminPath.sweep_dead` clears the rest in the background.
Codes are plain ints here: replies carry ints, and the hot loops should not convert enums.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import xxhash

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.hooks import ReclaimHooks
from kvpool.master.liveness import ClientTable
from kvpool.master.metadata import (
    ObjectIndex,
    ObjectMeta,
    Replica,
)
from kvpool.master.placement import Placement
from kvpool.master.segments import Segment, SegmentTable
from kvpool.protocol.messages import (
    ClientId,
    ReplicaListReply,
    ReplicaStatus,
    Reply,
    SegmentName,
)

if TYPE_CHECKING:
    from kvpool.master.arenas import Arena
    from kvpool.master.tasks import Task

__all__ = ["ServiceState"]

log = logging.getLogger(__name__)

# Codes as plain ints: replies carry ints, and the hot loops should not convert enums.
_OK = 0
_INVALID_PARAMS = int(ErrorCode.INVALID_PARAMS)
_ILLEGAL_CLIENT = int(ErrorCode.ILLEGAL_CLIENT)
_NO_SPACE = int(ErrorCode.NO_AVAILABLE_HANDLE)
_NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
_EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
_HAS_LEASE = int(ErrorCode.OBJECT_HAS_LEASE)
_NOT_READY = int(ErrorCode.REPLICA_IS_NOT_READY)
_INVALID_WRITE = int(ErrorCode.INVALID_WRITE)
_BUSY = int(ErrorCode.OBJECT_REPLICA_BUSY)
_SEG_NOT_FOUND = int(ErrorCode.SEGMENT_NOT_FOUND)
_SEG_EXISTS = int(ErrorCode.SEGMENT_ALREADY_EXISTS)
_HAS_TASK = int(ErrorCode.OBJECT_HAS_REPLICATION_TASK)

_PROCESSING = ReplicaStatus.PROCESSING
_COMPLETE = ReplicaStatus.COMPLETE
_REMOVE_CHUNK = 5_000

# Replies that carry nothing but a code are shared: the server only encodes them.
_OK_REPLY = Reply(_OK)
_NOT_FOUND_LIST = ReplicaListReply(_NOT_FOUND)
_NOT_READY_LIST = ReplicaListReply(_NOT_READY)


class ServiceState:
    """What every part of `MasterService` shares (one event loop owns it; nothing locks)."""

    _config: MasterConfig
    _clock: Callable[[], float]
    _hooks: ReclaimHooks
    _index: ObjectIndex
    segments: SegmentTable
    clients: ClientTable
    _placement: Placement
    _lease_ttl: float
    _lease_ttl_ms: int
    _discard_timeout: float
    # Replicas of preempted or force-removed PutStarts: (release_at, seq, size, replicas).
    _parked: list[tuple[float, int, int, tuple[Replica, ...]]]
    _park_seq: int
    _started: float
    view_version: int
    #: Set when a segment went away; the server then runs `sweep_dead`.
    sweep_needed: bool
    #: When the monitor last ran `check_liveness` (None: not yet).
    _last_liveness: float | None
    # Replica tasks (tasks.py): every task by id (ended ones until their retention runs out),
    # the active task of an object, each executor's PENDING tasks in creation order, and
    # (ended time, id) of ended tasks in the order they ended.
    _tasks: dict[str, Task]
    _task_of: dict[ObjectMeta, Task]
    _task_queues: dict[ClientId, dict[str, Task]]
    _tasks_ended: deque[tuple[float, str]]
    # Arenas (arenas.py): every live arena by id, each client's arenas, and the ghosts of
    # arenas on unmounted segments: (offset, size, reserved until) by segment name.
    _arenas: dict[int, Arena]
    _arenas_of: dict[ClientId, dict[int, Arena]]
    _ghosts: dict[SegmentName, list[tuple[int, int, float]]]

    def _park(self, obj: ObjectMeta) -> None:
        if obj.replicas:
            release_at = obj.put_start_time + self._config.put_start_release_timeout
            self._park_until(release_at, obj.size, obj.replicas)
            obj.replicas = ()

    def _park_until(self, release_at: float, size: int, replicas: tuple[Replica, ...]) -> None:
        """Keep `replicas` allocated until `release_at` (someone may still use their bytes)."""
        self._park_seq += 1
        heapq.heappush(self._parked, (release_at, self._park_seq, size, replicas))

    # Implemented by tasks.TaskPath (declared here for the parts that call them).
    def _fail_task(self, task: Task, message: str, *, reported: bool = False) -> None:
        raise NotImplementedError

    def _fail_tasks_of_client(self, client_id: ClientId) -> None:
        raise NotImplementedError

    def _fail_tasks_on_segment(self, seg: Segment) -> None:
        raise NotImplementedError

    def _expire_tasks(self) -> int:
        raise NotImplementedError

    # Implemented by arenas.ArenaPath.
    def _expire_arenas(self, client_id: ClientId) -> None:
        raise NotImplementedError

    def _drop_arenas_on(self, seg: Segment) -> None:
        raise NotImplementedError

    def _restore_ghosts(self, seg: Segment) -> None:
        raise NotImplementedError

    def _expire_idle_arenas(self) -> int:
        raise NotImplementedError

    def arena_stats(self) -> tuple[int, int]:
        raise NotImplementedError

    def _evict_one_replica(self, obj: ObjectMeta, replica: Replica) -> int:
        """Drop one replica of `obj` (the object goes with its last one); bytes freed."""
        freed = self._aligned(obj.size) if self._free_replica(replica, obj.size) else 0
        obj.replicas = tuple(r for r in obj.replicas if r is not replica)
        self._hooks.on_replica_removed(obj, replica)
        if not obj.replicas:
            self._drop(obj)
        return freed

    def _revoke(self, obj: ObjectMeta) -> None:
        """Free everything a PutStart (or in-place UpsertStart) took and forget the object."""
        self.clients.drop_in_flight(obj)
        self._free_and_drop(obj)

    def _free_and_drop(self, obj: ObjectMeta) -> int:
        """Free every replica of `obj` now and forget it; answers the bytes freed."""
        freed = 0
        aligned = self._aligned(obj.size)
        for r in obj.replicas:
            if self._free_replica(r, obj.size):
                freed += aligned
        obj.replicas = ()
        self._drop(obj)
        return freed

    def _preempt(self, old: ObjectMeta) -> None:
        """Take an unfinished PutStart's key away from it (stale, or its client expired); its
        writer may still be writing, so its space stays parked until
        `put_start_release_timeout` after it started."""
        log.info("preempting unfinished PutStart of %r by client %s", old.key, old.client_id)
        self._park(old)
        self.clients.drop_in_flight(old)
        self._drop(old)

    def _lookup(self, tenant: str, key: str) -> ObjectMeta | None:
        """The object, unless all of its replicas sit on unmounted segments (then it is
        dropped here and None answered)."""
        obj = self._index.get(tenant, key)
        if obj is None or obj.has_live_replica():
            return obj
        self._forget_dead(obj)
        return None

    def _forget_dead(self, obj: ObjectMeta) -> None:
        self.clients.drop_in_flight(obj)
        obj.replicas = ()
        self._drop(obj)

    def _drop(self, obj: ObjectMeta) -> None:
        if self._index.discard(obj):
            self._hooks.on_object_removed(obj)
        if self._task_of:
            task = self._task_of.get(obj)
            if task is not None:
                self._fail_task(task, "the object was removed")

    def _free_replica(self, r: Replica, size: int) -> bool:
        seg = r.segment
        if not seg.alive:
            return False  # its allocator went with the segment
        seg.allocator.free(r.offset, size)
        seg.objects -= 1
        return True

    def _aligned(self, size: int) -> int:
        a = self._config.alignment
        return (size + a - 1) // a * a

    def shard_hash(self, tenant: str, key: str) -> int:
        """The raw 64-bit hash behind `shard_of` (exposed for tests of its stability)."""
        seed = xxhash.xxh3_64_intdigest(tenant.encode())
        return int(xxhash.xxh3_64_intdigest(key.encode(), seed))
