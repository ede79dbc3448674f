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

Active tasks are few (one per object at most), so the monitor's checks walk them all.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from kvpool.errors import ErrorCode
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.segments import Segment
from kvpool.master.state import (
    _COMPLETE,
    _HAS_TASK,
    _ILLEGAL_CLIENT,
    _INVALID_PARAMS,
    _NO_SPACE,
    _NOT_FOUND,
    _NOT_READY,
    _OK,
    _OK_REPLY,
    _PROCESSING,
    _SEG_NOT_FOUND,
    ServiceState,
)
from kvpool.protocol.messages import (
    BatchReplicaClear,
    BatchReplicaClearReply,
    ClientId,
    CreateCopyTask,
    CreateMoveTask,
    FetchTasks,
    FetchTasksReply,
    MarkTaskComplete,
    QueryTask,
    QueryTaskReply,
    ReplicaKind,
    ReplicaTask,
    Reply,
    SegmentName,
    TaskReply,
    TaskStatus,
    TaskType,
    TenantId,
)

__all__ = ["Task", "TaskPath"]

log = logging.getLogger(__name__)

_NO_TASK = int(ErrorCode.OBJECT_NO_REPLICATION_TASK)
_TASK_NOT_FOUND = int(ErrorCode.TASK_NOT_FOUND)
_REPLICA_NOT_FOUND = int(ErrorCode.REPLICA_NOT_FOUND)
_REPLICA_EXISTS = int(ErrorCode.REPLICA_ALREADY_EXISTS)
_REPLICA_GONE = int(ErrorCode.REPLICA_IS_GONE)
_CLIENT_NOT_FOUND = int(ErrorCode.CLIENT_NOT_FOUND)
_MEMORY = ReplicaKind.MEMORY

TaskDone = Callable[[bool], None]
"""Called once when a task ends: True when it succeeded (metadata switched)."""


class Task:
    """One replica task (slotted: few exist, but they are looked up on every report)."""

    __slots__ = (
        "created",
        "executor",
        "message",
        "obj",
        "on_done",
        "source",
        "status",
        "targets",
        "task_id",
        "task_type",
        "updated",
    )

    def __init__(  # noqa: PLR0917
        self,
        task_id: str,
        task_type: TaskType,
        obj: ObjectMeta,
        source: Replica,
        targets: tuple[Replica, ...],
        executor: ClientId,
        now: float,
        on_done: TaskDone | None,
    ) -> None:
        self.task_id = task_id
        self.task_type = task_type
        self.obj = obj
        self.source = source
        self.targets = targets
        self.executor = executor
        self.status = TaskStatus.PENDING
        self.message = ""
        self.created = now
        self.updated = now
        self.on_done = on_done

    @property
    def active(self) -> bool:
        return self.status is TaskStatus.PENDING or self.status is TaskStatus.PROCESSING

    def touches(self, seg: Segment) -> bool:
        return self.source.segment is seg or any(t.segment is seg for t in self.targets)

    def wire(self) -> ReplicaTask:
        obj = self.obj
        segs: dict[SegmentName, Segment] = {self.source.segment.name: self.source.segment}
        for t in self.targets:
            segs[t.segment.name] = t.segment
        return ReplicaTask(
            self.task_id,
            self.task_type,
            obj.key,
            obj.tenant,
            obj.size,
            obj.checksum,
            self.source.desc(obj.size),
            [t.desc(obj.size) for t in self.targets],
            [s.info() for s in segs.values()],
        )

    def __repr__(self) -> str:
        return (
            f"Task({self.task_id[:8]}, {self.task_type.name}, {self.obj.key!r}, "
            f"{self.status.name}, executor={self.executor})"
        )


class TaskPath(ServiceState):
    """Replica tasks (create, fetch, report, query, expiry) and BatchReplicaClear."""

    # ------------------------------------------------------------------ requests

    def create_copy_task(self, req: CreateCopyTask) -> TaskReply:
        obj, code = self._task_object(req.tenant, req.key)
        if obj is None:
            return TaskReply(code)
        if not req.targets or len(set(req.targets)) != len(req.targets):
            return TaskReply(_INVALID_PARAMS)
        source = next((r for r in obj.replicas if r.kind is _MEMORY and r.readable()), None)
        if source is None:
            return TaskReply(_REPLICA_NOT_FOUND)
        task, code = self._start_task(TaskType.COPY, obj, source, req.targets, None)
        return TaskReply(code, task.task_id if task is not None else "")

    def create_move_task(self, req: CreateMoveTask) -> TaskReply:
        obj, code = self._task_object(req.tenant, req.key)
        if obj is None:
            return TaskReply(code)
        if req.source == req.target:
            return TaskReply(_INVALID_PARAMS)
        source = next(
            (r for r in obj.replicas if r.segment.name == req.source and r.readable()), None
        )
        if source is None:
            return TaskReply(_REPLICA_NOT_FOUND)
        task, code = self._start_task(TaskType.MOVE, obj, source, [req.target], None)
        return TaskReply(code, task.task_id if task is not None else "")

    def query_task(self, req: QueryTask) -> QueryTaskReply:
        task = self._tasks.get(req.task_id)
        if task is None:
            return QueryTaskReply(_TASK_NOT_FOUND, req.task_id)
        now = self._clock()
        return QueryTaskReply(
            _OK,
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
            return FetchTasksReply(_INVALID_PARAMS)
        if self.clients.get(req.client_id) is None:
            return FetchTasksReply(_CLIENT_NOT_FOUND)
        queue = self._task_queues.get(req.client_id)
        if not queue:
            return FetchTasksReply(_OK)
        now = self._clock()
        out: list[ReplicaTask] = []
        for task_id in list(queue)[: req.max_tasks]:
            task = queue.pop(task_id)
            task.status = TaskStatus.PROCESSING
            task.updated = now
            out.append(task.wire())
        if not queue:
            del self._task_queues[req.client_id]
        return FetchTasksReply(_OK, out)

    def mark_task_complete(self, req: MarkTaskComplete) -> Reply:
        task = self._tasks.get(req.task_id)
        if task is None:
            return Reply(_TASK_NOT_FOUND)
        if task.executor != req.client_id:
            return Reply(_ILLEGAL_CLIENT)
        if not task.active:
            return Reply(_NO_TASK)  # it ended already (timed out, object removed, ...)
        if not req.ok:
            self._fail_task(task, req.message or "the executor reported a failure", reported=True)
            return _OK_REPLY
        if not all(t.segment.alive for t in task.targets):
            self._fail_task(task, "a target segment was unmounted", reported=True)
            return Reply(_REPLICA_GONE)
        self._succeed_task(task)
        return _OK_REPLY

    def batch_replica_clear(self, req: BatchReplicaClear) -> BatchReplicaClearReply:
        """Mooncake's BatchReplicaClear: the client's own complete objects whose lease has
        expired and that have no task lose all their replicas (the object goes) or, with
        `segment_name`, those on that segment (the object goes with its last one)."""
        if not req.client_id:
            return BatchReplicaClearReply(_INVALID_PARAMS)
        now = self._clock()
        cleared: list[str] = []
        for key in req.keys:
            obj = self._lookup(req.tenant, key)
            if (
                obj is None
                or obj.client_id != req.client_id
                or not obj.complete
                or now < obj.lease_deadline
                or obj in self._task_of
            ):
                continue
            if not req.segment_name:
                self._free_and_drop(obj)
                cleared.append(key)
                continue
            mine = [r for r in obj.replicas if r.segment.name == req.segment_name]
            if not mine:
                continue
            for r in mine:
                self._evict_one_replica(obj, r)
            cleared.append(key)
        return BatchReplicaClearReply(_OK, cleared)

    # ------------------------------------------------------------------ for the service

    def swap_out(
        self, obj: ObjectMeta, replica: Replica, low_watermark: float, on_done: TaskDone
    ) -> bool:
        """Pool mode: move `replica` to another segment with room, through a MOVE task.

        The destination is a live segment without a replica of `obj` that stays at or below
        `low_watermark` (a fraction of its capacity) with this replica added, the emptiest
        first; it is allocated directly (never through reclaim). False, with nothing changed,
        when no segment can take it or nobody can execute the move; otherwise `on_done` is
        called once when the task ends.
        """
        if obj in self._task_of or not obj.complete or replica not in obj.replicas:
            return False
        aligned = self._aligned(obj.size)
        held = {r.segment for r in obj.replicas}
        candidates = sorted(
            (
                s
                for s in self.segments.live
                if s not in held
                and s.allocator.allocated + aligned <= low_watermark * s.allocator.capacity
            ),
            key=lambda s: s.allocator.allocated / max(1, s.allocator.capacity),
        )
        for seg in candidates:
            task, _code = self._start_task(TaskType.MOVE, obj, replica, [seg.name], on_done)
            if task is not None:
                return True
        return False

    def has_task(self, obj: ObjectMeta) -> bool:
        return obj in self._task_of

    def _expire_tasks(self) -> int:
        """Fail tasks older than `replica_task_timeout` or whose executor is gone, and forget
        ended tasks older than `task_retention`; answers how many tasks failed."""
        now = self._clock()
        failed = 0
        timeout = self._config.replica_task_timeout
        for task in list(self._task_of.values()):
            if now - task.created >= timeout:
                self._fail_task(task, f"timed out after {timeout:g} s")
                failed += 1
            elif self.clients.get(task.executor) is None:
                self._fail_task(task, f"executor {task.executor} is gone")
                failed += 1
        keep = now - self._config.task_retention
        ended = self._tasks_ended
        while ended and ended[0][0] <= keep:
            _, task_id = ended.popleft()
            self._tasks.pop(task_id, None)
        return failed

    def _fail_tasks_of_client(self, client_id: ClientId) -> None:
        for task in list(self._task_of.values()):
            if task.executor == client_id:
                self._fail_task(task, f"executor {client_id} expired")

    def _fail_tasks_on_segment(self, seg: Segment) -> None:
        for task in list(self._task_of.values()):
            if task.touches(seg):
                self._fail_task(task, f"segment {seg.name} was unmounted")

    # ------------------------------------------------------------------ internals

    def _task_object(self, tenant: TenantId, key: str) -> tuple[ObjectMeta | None, int]:
        if not key:
            return None, _INVALID_PARAMS
        obj = self._lookup(tenant, key)
        if obj is None:
            return None, _NOT_FOUND
        if not obj.complete:
            return None, _NOT_READY
        if obj in self._task_of:
            return None, _HAS_TASK
        return obj, _OK

    def _start_task(
        self,
        task_type: TaskType,
        obj: ObjectMeta,
        source: Replica,
        targets: list[SegmentName],
        on_done: TaskDone | None,
    ) -> tuple[Task | None, int]:
        segs: list[Segment] = []
        held = {r.segment for r in obj.replicas if r.segment.alive}
        for name in targets:
            seg = self.segments.get(name)
            if seg is None:
                return None, _SEG_NOT_FOUND
            if seg in held:
                return None, _REPLICA_EXISTS
            segs.append(seg)
        executor = self._executor_for(source.segment)
        if executor is None:
            return None, _CLIENT_NOT_FOUND
        got: list[Replica] = []
        for seg in segs:
            off = seg.allocator.alloc(obj.size)
            if off is None:
                for r in got:
                    self._free_replica(r, obj.size)
                return None, _NO_SPACE
            seg.objects += 1
            got.append(Replica(seg, off, _PROCESSING))
        now = self._clock()
        task = Task(uuid.uuid4().hex, task_type, obj, source, tuple(got), executor, now, on_done)
        self._tasks[task.task_id] = task
        self._task_of[obj] = task
        self._task_queues.setdefault(executor, {})[task.task_id] = task
        log.debug("task %r created", task)
        return task, _OK

    def _executor_for(self, seg: Segment) -> ClientId | None:
        """The source segment's owner when it is alive, else a live client with a segment on
        the same host (it can map the source's memory)."""
        if self.clients.get(seg.client_id) is not None:
            return seg.client_id
        for other in self.segments.live:
            if other.host_id == seg.host_id and self.clients.get(other.client_id) is not None:
                return other.client_id
        return None

    def _succeed_task(self, task: Task) -> None:
        obj = task.obj
        on_complete = self._hooks.on_replica_complete
        for t in task.targets:
            t.status = _COMPLETE
        if task.task_type is TaskType.COPY:
            obj.replicas = obj.replicas + task.targets
            for t in task.targets:
                on_complete(obj, t)
            self._end_task(task, TaskStatus.SUCCESS, "")
            return
        (target,) = task.targets
        source = task.source
        obj.replicas = tuple(target if r is source else r for r in obj.replicas)
        if target not in obj.replicas:  # the source left meanwhile: keep the copy anyway
            obj.replicas = (*obj.replicas, target)
        on_complete(obj, target)
        self._end_task(task, TaskStatus.SUCCESS, "")
        self._hooks.on_replica_removed(obj, source)
        if self._clock() < obj.lease_deadline:
            # A reader holding the lease may still be copying from the source.
            self._park_until(obj.lease_deadline, obj.size, (source,))
        else:
            self._free_replica(source, obj.size)

    def _fail_task(self, task: Task, message: str, *, reported: bool = False) -> None:
        """End `task` as FAILED. Its targets are freed at once only when nobody can be writing
        into them: the executor reported (`reported`), or never fetched the task. Otherwise
        (the executor expired, the task timed out, a segment went, the object was removed)
        the executor may still be copying, so the targets stay parked for
        `put_start_release_timeout` (a target on an unmounted segment has nothing to park)."""
        size = task.obj.size
        if reported or task.status is TaskStatus.PENDING:
            for t in task.targets:
                self._free_replica(t, size)
        else:
            live = tuple(t for t in task.targets if t.segment.alive)
            if live:
                release_at = self._clock() + self._config.put_start_release_timeout
                self._park_until(release_at, size, live)
        log.info("task %r failed: %s", task, message)
        self._end_task(task, TaskStatus.FAILED, message)

    def _end_task(self, task: Task, status: TaskStatus, message: str) -> None:
        task.status = status
        task.message = message
        task.updated = self._clock()
        if self._task_of.get(task.obj) is task:
            del self._task_of[task.obj]
        queue = self._task_queues.get(task.executor)
        if queue is not None and queue.pop(task.task_id, None) is not None and not queue:
            del self._task_queues[task.executor]
        self._tasks_ended.append((task.updated, task.task_id))
        done, task.on_done = task.on_done, None
        if done is not None:
            done(status is TaskStatus.SUCCESS)
