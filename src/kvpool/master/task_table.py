"""The task table: every replica task, by id, by object and by executor, and their lifecycle.

A task (`Task`) copies or moves one object's bytes to ranges the master allocated for it
(`tasks.py` has the protocol, step by step). The table keeps every task by id (ended ones for
`task_retention`, for QueryTask), the active task of each object (one at most), each executor's
PENDING tasks in creation order, and the ended tasks in the order they ended. It starts tasks
(allocating their targets through the core), hands them out, ends them (switching the
metadata through the core on success, freeing or parking the targets on failure), and fails
them when their object, a segment they touch or their executor goes: it is a
`MetadataObserver` of the core. Active tasks are few (one per object at most), so those checks
walk them all.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Sequence

from kvpool.codes import (
    CLIENT_NOT_FOUND,
    NO_AVAILABLE_HANDLE,
    OK,
    REPLICA_ALREADY_EXISTS,
    SEGMENT_NOT_FOUND,
)
from kvpool.master.core import MetadataCore, MetadataObserver
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.segments import Segment
from kvpool.override import override
from kvpool.protocol.messages import (
    ClientId,
    ReplicaTask,
    SegmentName,
    TaskStatus,
    TaskType,
)

__all__ = ["Task", "TaskDone", "TaskTable"]

log = logging.getLogger(__name__)

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
        "repair",
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
        repair: bool = False,
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
        #: The master's own task (a repair copy, a defragmentation move): a Remove or an
        #: upsert cancels it instead of waiting.
        self.repair = repair

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


class TaskTable(MetadataObserver):
    """Every replica task and the rules of their lifecycle (a `MetadataObserver`)."""

    def __init__(self, core: MetadataCore) -> None:
        self._core = core
        self._config = core.config
        self._clock = core.clock
        self._tasks: dict[str, Task] = {}
        self._task_of: dict[ObjectMeta, Task] = {}
        self._queues: dict[ClientId, dict[str, Task]] = {}
        self._ended: deque[tuple[float, str]] = deque()

    # ------------------------------------------------------------------ reading

    def get(self, task_id: str) -> Task | None:
        """The task, active or ended within `task_retention`."""
        return self._tasks.get(task_id)

    def has_task(self, obj: ObjectMeta) -> bool:
        """A task is running on `obj`."""
        return obj in self._task_of

    def blocks(self, obj: ObjectMeta) -> bool:
        """A task that a Remove or an upsert must wait for (a copy or move someone asked
        for; the master's own repairs are cancelled instead) is running on `obj`."""
        if not self._task_of:
            return False
        task = self._task_of.get(obj)
        return task is not None and not task.repair

    def cancel_repair(self, obj: ObjectMeta) -> None:
        """Fail the repair copy running on `obj`, if any (its object is being rewritten)."""
        task = self._task_of.get(obj) if self._task_of else None
        if task is not None and task.repair:
            self.fail(task, "cancelled: the object is being rewritten")

    @property
    def active(self) -> int:
        """Tasks running (PENDING or PROCESSING)."""
        return len(self._task_of)

    def running(self) -> list[Task]:
        """The tasks not ended yet (their targets are charged to their objects' tenants)."""
        return list(self._task_of.values())

    def pending(self, client_id: ClientId) -> int:
        """The client's PENDING tasks (not fetched yet)."""
        queue = self._queues.get(client_id) if self._queues else None
        return len(queue) if queue else 0

    # ------------------------------------------------------------------ lifecycle

    def start(
        self,
        task_type: TaskType,
        obj: ObjectMeta,
        source: Replica,
        targets: list[SegmentName],
        on_done: TaskDone | None,
        *,
        repair: bool = False,
        executor: ClientId | None = None,
    ) -> tuple[Task | None, int]:
        """A PENDING task copying `source` of `obj` to new ranges on `targets`, or (None,
        the code that refuses it); nothing changes when refused. A silent segment is no
        target (SEGMENT_NOT_FOUND). `executor`: who runs it (the tier manager names a disk
        segment's owner, which journals what it writes); by default the source's owner."""
        core = self._core
        segs: list[Segment] = []
        held = {r.segment for r in obj.replicas if r.segment.alive}
        for name in targets:
            seg = core.segments.get(name)
            if seg is None or not seg.serving or seg.draining:
                return None, SEGMENT_NOT_FOUND
            if seg in held:
                return None, REPLICA_ALREADY_EXISTS
            segs.append(seg)
        if executor is None:
            executor = self._executor_for(source.segment)
        if executor is None:
            return None, CLIENT_NOT_FOUND
        got: list[Replica] = []
        for seg in segs:
            r = core.allocate_on(seg, obj.size)
            if r is None:
                core.free_replicas(tuple(got), obj.size)
                return None, NO_AVAILABLE_HANDLE
            got.append(r)
        return self._launch(task_type, obj, source, tuple(got), executor, on_done, repair), OK

    def _launch(  # noqa: PLR0917
        self,
        task_type: TaskType,
        obj: ObjectMeta,
        source: Replica,
        targets: tuple[Replica, ...],
        executor: ClientId,
        on_done: TaskDone | None,
        repair: bool,
    ) -> Task:
        """Record a PENDING task onto the allocated `targets` and queue it for `executor`."""
        now = self._clock()
        task = Task(
            uuid.uuid4().hex, task_type, obj, source, targets, executor, now, on_done, repair
        )
        self._tasks[task.task_id] = task
        # Quota: the targets hold space from now on; `_end` refunds it (on success the
        # targets are charged again as replicas of the object, by the core).
        self._core.index.charge(obj.tenant, obj.size * len(targets))
        self._task_of[obj] = task
        self._queues.setdefault(executor, {})[task.task_id] = task
        log.debug("task %r created", task)
        return task

    def _executor_for(self, seg: Segment) -> ClientId | None:
        """The source segment's owner when it is alive and not silent, else such a client
        with a segment on the same host (it can map the source's memory)."""
        clients = self._core.clients
        rec = clients.get(seg.client_id)
        if rec is not None and not rec.silent:
            return seg.client_id
        for other in self._core.segments.live:  # serving segments: their owners answer
            if other.host_id == seg.host_id and clients.get(other.client_id) is not None:
                return other.client_id
        return None

    def fetch(self, client_id: ClientId, max_tasks: int) -> list[ReplicaTask]:
        """Up to `max_tasks` of the client's PENDING tasks, oldest first; PROCESSING now."""
        queue = self._queues.get(client_id)
        if not queue:
            return []
        now = self._clock()
        out: list[ReplicaTask] = []
        for task_id in list(queue)[:max_tasks]:
            task = queue.pop(task_id)
            task.status = TaskStatus.PROCESSING
            task.updated = now
            out.append(task.wire())
        if not queue:
            del self._queues[client_id]
        return out

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
        aligned = self._core.aligned(obj.size)
        held = {r.segment for r in obj.replicas}
        candidates = sorted(
            (
                s
                for s in self._core.segments.live
                if s not in held
                and s.allocator.allocated + aligned <= low_watermark * s.allocator.capacity
            ),
            key=lambda s: s.allocator.allocated / max(1, s.allocator.capacity),
        )
        for seg in candidates:
            task, _code = self.start(TaskType.MOVE, obj, replica, [seg.name], on_done)
            if task is not None:
                return True
        return False

    def move_away(
        self,
        moves: Sequence[tuple[ObjectMeta, Replica, TaskDone]],
        keep_free: Sequence[tuple[int, int]],
        low_watermark: float,
    ) -> bool:
        """Pool-mode defragmentation: move each `(obj, replica, on_done)` of `moves` out of
        the range being made, through MOVE tasks, all or none. A destination is another
        serving segment without a replica of its object that stays at or below
        `low_watermark` with it, the emptiest first, else the replica's own segment outside
        `keep_free` (the free ranges of the range being made: no move may land in it);
        allocated directly (never through reclaim). False, with nothing changed, when one of
        them cannot move (a task on its object, no room, nobody to execute it); otherwise each
        `on_done` is called once when its task ends."""
        core = self._core
        planned: list[tuple[ObjectMeta, Replica, Replica, ClientId, TaskDone]] = []
        seen: set[ObjectMeta] = set()

        def undo() -> bool:
            for obj, _, target, _, _ in planned:
                core.free_replicas((target,), obj.size)
            return False

        for obj, replica, on_done in moves:
            if obj in self._task_of or obj in seen or not obj.complete:
                return undo()
            home = replica.segment
            executor = self._executor_for(home) if home.serving else None
            if executor is None or replica not in obj.replicas:
                return undo()
            target = self._destination(obj, home, keep_free, low_watermark)
            if target is None:
                return undo()
            seen.add(obj)
            planned.append((obj, replica, target, executor, on_done))
        for obj, replica, target, executor, on_done in planned:
            # The master's own move, as a repair copy: a Remove or an upsert of the object
            # cancels it rather than waiting for it (the caller never asked for it).
            self._launch(TaskType.MOVE, obj, replica, (target,), executor, on_done, True)
        return True

    def _destination(
        self,
        obj: ObjectMeta,
        home: Segment,
        keep_free: Sequence[tuple[int, int]],
        low_watermark: float,
    ) -> Replica | None:
        """Where a defragmentation move of `obj`'s replica on `home` goes (see `move_away`)."""
        core = self._core
        aligned = core.aligned(obj.size)
        held = {r.segment for r in obj.replicas}
        others = sorted(
            (
                s
                for s in core.segments.live
                if s not in held
                and s.allocator.allocated + aligned <= low_watermark * s.allocator.capacity
            ),
            key=lambda s: s.allocator.allocated / max(1, s.allocator.capacity),
        )
        for seg in others:
            target = core.allocate_on(seg, obj.size)
            if target is not None:
                return target
        return core.allocate_on(home, obj.size, keep_free)

    def succeed(self, task: Task) -> None:
        """The executor copied every target: switch the metadata (copy: the targets join the
        object; move: the target takes the source's place, the source is let go)."""
        core = self._core
        obj = task.obj
        if task.task_type is TaskType.COPY:
            core.add_replicas(obj, task.targets)
            self._end(task, TaskStatus.SUCCESS, "")
            return
        (target,) = task.targets
        core.move_replica(obj, task.source, target)
        self._end(task, TaskStatus.SUCCESS, "")
        core.release_moved_source(obj, task.source, self._clock())

    def fail(self, task: Task, message: str, *, reported: bool = False) -> None:
        """End `task` as FAILED. Its targets are freed at once only when nobody can be writing
        into them: the executor reported (`reported`), or never fetched the task. Otherwise
        (the executor expired, the task timed out, a segment went, the object was removed)
        the executor may still be copying, so the targets stay parked for
        `put_start_release_timeout` (a target on an unmounted segment has nothing to park)."""
        size = task.obj.size
        if reported or task.status is TaskStatus.PENDING:
            self._core.free_replicas(task.targets, size)
        else:
            live = tuple(t for t in task.targets if t.segment.alive)
            if live:
                release_at = self._clock() + self._config.put_start_release_timeout
                self._core.park(release_at, size, live)
        log.info("task %r failed: %s", task, message)
        self._end(task, TaskStatus.FAILED, message)

    def _end(self, task: Task, status: TaskStatus, message: str) -> None:
        self._core.index.charge(task.obj.tenant, -task.obj.size * len(task.targets))
        task.status = status
        task.message = message
        task.updated = self._clock()
        if self._task_of.get(task.obj) is task:
            del self._task_of[task.obj]
        queue = self._queues.get(task.executor)
        if queue is not None and queue.pop(task.task_id, None) is not None and not queue:
            del self._queues[task.executor]
        self._ended.append((task.updated, task.task_id))
        done, task.on_done = task.on_done, None
        if done is not None:
            done(status is TaskStatus.SUCCESS)

    def expire(self) -> int:
        """Fail tasks older than `replica_task_timeout` or whose executor is gone, and forget
        ended tasks older than `task_retention`; answers how many tasks failed."""
        if not self._task_of and not self._ended:
            return 0
        now = self._clock()
        failed = 0
        timeout = self._config.replica_task_timeout
        clients = self._core.clients
        for task in list(self._task_of.values()):
            rec = clients.get(task.executor)
            if now - task.created >= timeout:
                self.fail(task, f"timed out after {timeout:g} s")
                failed += 1
            elif rec is None or rec.silent:
                self.fail(task, f"executor {task.executor} is gone")
                failed += 1
        keep = now - self._config.task_retention
        ended = self._ended
        while ended and ended[0][0] <= keep:
            _, task_id = ended.popleft()
            self._tasks.pop(task_id, None)
        return failed

    # ------------------------------------------------------------------ MetadataObserver

    @override
    def object_removed(self, obj: ObjectMeta) -> None:
        if self._task_of:
            task = self._task_of.get(obj)
            if task is not None:
                self.fail(task, "the object was removed")

    @override
    def segment_mounted(self, seg: Segment) -> None:
        pass

    @override
    def segment_unmounted(self, seg: Segment) -> None:
        for task in list(self._task_of.values()):
            if task.touches(seg):
                self.fail(task, f"segment {seg.name} was unmounted")

    @override
    def client_expired(self, client_id: ClientId) -> None:
        for task in list(self._task_of.values()):
            if task.executor == client_id:
                self.fail(task, f"executor {client_id} expired")

    @override
    def client_silenced(self, client_id: ClientId) -> None:
        """Fail the tasks the silent client executes or whose segments it owns: it cannot
        copy now, and a silent segment is neither read nor written."""
        for task in list(self._task_of.values()):
            if task.executor == client_id or not task.source.segment.serving:
                self.fail(task, f"client {client_id} fell silent")
            elif any(not t.segment.serving for t in task.targets):
                self.fail(task, f"a target's owner {client_id} fell silent")

    @override
    def segment_restored(self, seg: Segment) -> None:
        pass

    @override
    def replicas_lost(self, obj: ObjectMeta) -> None:
        pass
