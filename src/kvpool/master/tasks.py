"""Replica tasks: copy or move an object's bytes between segments, executed by a node.

Mooncake's create_copy_task / create_move_task / query_task / FetchTasks / MarkTaskToComplete,
and the mechanism of pool-mode swap-out. The master never touches bytes: it allocates the
destination ranges (PROCESSING, invisible to readers, not in `ObjectMeta.replicas` until the
task succeeds), picks the client that executes the copy, and switches the metadata when that
client reports. The protocol, step by step (also in `kvpool.protocol.messages`):

1. `CreateCopyTask(key, targets)` / `CreateMoveTask(key, source, target)` (or the reclaim
   adapter's `swap_out`) → `TaskReply(code, task_id)`. Refused with OBJECT_NOT_FOUND,
   REPLICA_IS_NOT_READY (a write in progress), OBJECT_HAS_REPLICATION_TASK (one task per object
   at a time), SEGMENT_NOT_FOUND, REPLICA_NOT_FOUND (move: no readable replica on `source`),
   REPLICA_ALREADY_EXISTS (a target already holds one), NO_AVAILABLE_HANDLE (a target has no
   room; reclaim is never triggered for a task's destination, so nothing loops), or
   CLIENT_NOT_FOUND (nobody can execute it: the source segment's owner is gone and no live
   client has a segment on its host). The task is PENDING for its executor.
2. The executor sees `PingReply.pending_tasks > 0` (or just polls) and sends
   `FetchTasks(client_id, max_tasks)`; the tasks it gets are PROCESSING from then on.
3. It copies `size` bytes from `source` to every `targets` replica and reports
   `MarkTaskComplete(client_id, task_id, ok, message)`. Success: copy adds the targets as
   COMPLETE replicas; move puts the target in the source's place (same position, so a moved
   primary stays primary) and frees the source at once when no read lease is live, else when
   the lease runs out (a reader may still be copying from it). Failure reported by the
   executor: the targets are freed.
4. A task also fails by itself when: its executor expires; a segment it touches is unmounted;
   the object is removed (only `force` removes an object with a task; Remove without it
   answers OBJECT_HAS_REPLICATION_TASK, and so does UpsertStart); or it is older than
   `replica_task_timeout`. A report on a task that already failed answers
   OBJECT_NO_REPLICATION_TASK. Until the task ends the source stays readable. A task that
   fails this way after its executor fetched it keeps its targets parked for
   `put_start_release_timeout` (the executor may still be copying into them).
5. `QueryTask(task_id)` answers type, status, message and times for `task_retention` seconds
   after the task ended (TASK_NOT_FOUND after that).

The request handlers live here (`TaskPath`); the tasks themselves and their lifecycle in
`task_table.py`.
"""

from __future__ import annotations

from kvpool.codes import (
    CLIENT_NOT_FOUND,
    ILLEGAL_CLIENT,
    INVALID_PARAMS,
    OBJECT_HAS_REPLICATION_TASK,
    OBJECT_NO_REPLICATION_TASK,
    OBJECT_NOT_FOUND,
    OK,
    REPLICA_IS_GONE,
    REPLICA_IS_NOT_READY,
    REPLICA_NOT_FOUND,
    TASK_NOT_FOUND,
    TENANT_QUOTA_EXCEEDED,
)
from kvpool.master.core import MetadataCore
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.quota import TenantQuotas
from kvpool.master.repair import RepairQueue
from kvpool.master.task_table import TaskTable
from kvpool.protocol.messages import (
    BatchReplicaClear,
    BatchReplicaClearReply,
    CreateCopyTask,
    CreateMoveTask,
    FetchTasks,
    FetchTasksReply,
    MarkTaskComplete,
    QueryTask,
    QueryTaskReply,
    ReplicaKind,
    Reply,
    ReportBadReplica,
    TaskReply,
    TaskType,
    TenantId,
)

__all__ = ["TaskPath"]

_MEMORY = ReplicaKind.MEMORY
_OK_REPLY = Reply(OK)


class TaskPath:
    """Replica task requests (create, fetch, report, query) and BatchReplicaClear."""

    def __init__(self, core: MetadataCore, tasks: TaskTable, repair: RepairQueue) -> None:
        self._core = core
        self._tasks = tasks
        self._repair = repair
        self._clock = core.clock
        #: The tenant quotas in force (None: none): a copy is refused TENANT_QUOTA_EXCEEDED
        #: when its targets would take the tenant past its quota (`kvpool.master.quota`).
        self.quotas: TenantQuotas | None = None

    def create_copy_task(self, req: CreateCopyTask) -> TaskReply:
        obj, code = self._task_object(req.tenant, req.key)
        if obj is None:
            return TaskReply(code)
        if not req.targets or len(set(req.targets)) != len(req.targets):
            return TaskReply(INVALID_PARAMS)
        source = next((r for r in obj.replicas if r.kind is _MEMORY and r.readable()), None)
        if source is None:
            return TaskReply(REPLICA_NOT_FOUND)
        limit = self.quotas.limit(obj.tenant) if self.quotas is not None else None
        used = self._core.index.tenant_bytes.get(obj.tenant, 0)
        if limit is not None and used + obj.size * len(req.targets) > limit:
            return TaskReply(TENANT_QUOTA_EXCEEDED)
        task, code = self._tasks.start(TaskType.COPY, obj, source, req.targets, None)
        return TaskReply(code, task.task_id if task is not None else "")

    def create_move_task(self, req: CreateMoveTask) -> TaskReply:
        obj, code = self._task_object(req.tenant, req.key)
        if obj is None:
            return TaskReply(code)
        if req.source == req.target:
            return TaskReply(INVALID_PARAMS)
        source = next(
            (r for r in obj.replicas if r.segment.name == req.source and r.readable()), None
        )
        if source is None:
            return TaskReply(REPLICA_NOT_FOUND)
        task, code = self._tasks.start(TaskType.MOVE, obj, source, [req.target], None)
        return TaskReply(code, task.task_id if task is not None else "")

    def query_task(self, req: QueryTask) -> QueryTaskReply:
        task = self._tasks.get(req.task_id)
        if task is None:
            return QueryTaskReply(TASK_NOT_FOUND, req.task_id)
        now = self._clock()
        return QueryTaskReply(
            OK,
            task.task_id,
            task.task_type,
            task.status,
            task.message,
            task.created,
            task.updated,
            task.obj.key,
            task.obj.tenant,
            task.executor,
            now - task.created,
        )

    def fetch_tasks(self, req: FetchTasks) -> FetchTasksReply:
        if req.max_tasks <= 0 or not req.client_id:
            return FetchTasksReply(INVALID_PARAMS)
        if self._core.clients.get(req.client_id) is None:
            return FetchTasksReply(CLIENT_NOT_FOUND)
        return FetchTasksReply(OK, self._tasks.fetch(req.client_id, req.max_tasks))

    def mark_task_complete(self, req: MarkTaskComplete) -> Reply:
        task = self._tasks.get(req.task_id)
        if task is None:
            return Reply(TASK_NOT_FOUND)
        if task.executor != req.client_id:
            return Reply(ILLEGAL_CLIENT)
        if not task.active:
            return Reply(OBJECT_NO_REPLICATION_TASK)  # it ended already (timed out, ...)
        if not req.ok:
            self._tasks.fail(task, req.message or "the executor reported a failure", reported=True)
            if req.bad_source:
                self._bad_replica(task.obj, task.source)
            return _OK_REPLY
        if not all(t.segment.alive for t in task.targets):
            self._tasks.fail(task, "a target segment was unmounted", reported=True)
            return Reply(REPLICA_IS_GONE)
        self._tasks.succeed(task)
        return _OK_REPLY

    def batch_replica_clear(self, req: BatchReplicaClear) -> BatchReplicaClearReply:
        """Mooncake's BatchReplicaClear: the client's own complete objects whose lease has
        expired and that have no task lose all their replicas (the object goes) or, with
        `segment_name`, those on that segment (the object goes with its last one)."""
        if not req.client_id:
            return BatchReplicaClearReply(INVALID_PARAMS)
        core = self._core
        now = self._clock()
        cleared: list[str] = []
        for key in req.keys:
            obj = core.lookup(req.tenant, key)
            if (
                obj is None
                or obj.client_id != req.client_id
                or not obj.complete
                or now < obj.lease_deadline
                or self._tasks.has_task(obj)
            ):
                continue
            if not req.segment_name:
                core.free_object(obj)
                cleared.append(key)
                continue
            mine = [r for r in obj.replicas if r.segment.name == req.segment_name]
            if not mine:
                continue
            for r in mine:
                core.drop_replica(obj, r)
            cleared.append(key)
        return BatchReplicaClearReply(OK, cleared)

    def report_bad_replica(self, req: ReportBadReplica) -> Reply:
        obj = self._core.lookup(req.tenant, req.key)
        if obj is None:
            return Reply(OBJECT_NOT_FOUND)
        bad = next(
            (r for r in obj.replicas if r.segment.name == req.segment and r.offset == req.offset),
            None,
        )
        if bad is None:
            return Reply(REPLICA_NOT_FOUND)
        self._bad_replica(obj, bad)
        return _OK_REPLY

    def _bad_replica(self, obj: ObjectMeta, bad: Replica) -> None:
        """Drop `bad`, a replica whose bytes do not match the object's checksum, and repair
        the object from another one; the last readable replica is kept (nothing better
        exists; a reader keeps getting CHECKSUM_MISMATCH, never wrong bytes), as is one
        under a running task (the task ends first)."""
        core = self._core
        if core.index.get(obj.tenant, obj.key) is not obj or bad not in obj.replicas:
            return
        if self._tasks.has_task(obj) or not any(
            r is not bad and r.readable() for r in obj.replicas
        ):
            return
        core.retire_replica(obj, bad, self._clock())
        self._repair.note(obj)

    def _task_object(self, tenant: TenantId, key: str) -> tuple[ObjectMeta | None, int]:
        if not key:
            return None, INVALID_PARAMS
        obj = self._core.lookup(tenant, key)
        if obj is None:
            return None, OBJECT_NOT_FOUND
        if not obj.complete:
            return None, REPLICA_IS_NOT_READY
        if self._tasks.has_task(obj):
            return None, OBJECT_HAS_REPLICATION_TASK
        return obj, OK
