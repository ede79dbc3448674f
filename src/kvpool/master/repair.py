"""Replica repair: copies that bring an object that lost replicas back to the count it asked for.

An object loses a replica when the segment holding it is unmounted (its owner unmounted it, or
was dropped after `client_dead_ttl`): the sweep (`MetadataCore.sweep_dead`) cuts the dead
replicas out and tells its observers (`replicas_lost`). `RepairQueue` is such an observer: it
queues each object left with fewer replicas on mounted segments than its put asked for
(`ObjectMeta.replica_num`); so is an object created with fewer replicas than it asked for
(too few segments had room: `MetadataCore.note_short`, at PutStart; looked at once its
PutEnd made it readable). Every `repair_interval` the server calls `tick`, which starts
COPY tasks (`TaskTable.start(..., repair=True)`, executed by a node's `TaskExecutor` like any
other copy) from a readable replica to new ranges on serving segments that hold none of the
object, the emptiest first. A replica on a silent segment still counts (it may come back); it
is never a source or a target.

Bounded, so repair never starves foreground work: at most `repair_per_tick` copies start per
tick and `repair_max_in_flight` run at once; a tick examines a bounded number of objects. A
copy that fails is tried again after `repair_backoff` * 2^(failures - 1) (at most 60 s), up to
`repair_max_attempts` failures; then the object is given up (`failed` counts every failed copy)
until its next loss. An object with no readable source (only silent replicas left) or no
segment to copy to waits until a segment is mounted or restored, and is looked at again every
`_WAITING_RETRY_S` (room may have been freed). An object removed meanwhile leaves the queue
(`object_removed`), and its running copy fails with it; a Remove or an upsert cancels a repair
copy instead of waiting for it (`TaskTable.blocks`, `TaskTable.cancel_repair`).

The queue holds each object at most once (dicts keyed by the record), so it is bounded by the
index; the bookkeeping on the put path is one comparison at PutStart, and on removal a test of
four dict sizes.
"""

from __future__ import annotations

import functools
import heapq
import logging

from kvpool.master.core import MetadataCore, MetadataObserver
from kvpool.master.metadata import ObjectMeta
from kvpool.master.segments import Segment
from kvpool.master.task_table import TaskTable
from kvpool.override import override
from kvpool.protocol.messages import ClientId, ReplicaKind, TaskType

__all__ = ["RepairQueue"]

log = logging.getLogger(__name__)

_MEMORY = ReplicaKind.MEMORY
_MAX_BACKOFF_S = 60.0
_WAITING_RETRY_S = 30.0
_EXAMINE_FACTOR = 4
"""A tick looks at most this many times `repair_per_tick` objects (most need nothing)."""


class RepairQueue(MetadataObserver):
    """Objects to repair and the repair copies running (a `MetadataObserver` of the core)."""

    def __init__(self, core: MetadataCore, tasks: TaskTable) -> None:
        self._core = core
        self._tasks = tasks
        cfg = core.config
        self._per_tick = cfg.repair_per_tick
        self._max_in_flight = cfg.repair_max_in_flight
        self._max_attempts = cfg.repair_max_attempts
        self._backoff = cfg.repair_backoff
        self._ready: dict[ObjectMeta, None] = {}  # in the order they were queued
        self._delayed: list[tuple[float, int, ObjectMeta]] = []  # (due, seq, obj) heap
        self._delayed_set: dict[ObjectMeta, float] = {}
        self._waiting: dict[ObjectMeta, None] = {}
        self._running: dict[ObjectMeta, None] = {}
        self._attempts: dict[ObjectMeta, int] = {}
        self._seq = 0
        self._next_wait_retry = 0.0
        #: Repair copies that succeeded, and that failed (each retried, up to the limit).
        self.done = 0
        self.failed = 0

    # ------------------------------------------------------------------ reading

    @property
    def queued(self) -> int:
        """Objects waiting for their next repair copy (due now or after a backoff)."""
        return len(self._ready) + len(self._delayed_set)

    @property
    def in_flight(self) -> int:
        """Repair copies running."""
        return len(self._running)

    @property
    def under_replicated(self) -> int:
        """Objects known to lack replicas: queued, copying, or waiting for a source or room."""
        return self.queued + len(self._running) + len(self._waiting)

    def tracks(self, obj: ObjectMeta) -> bool:
        return (
            obj in self._ready
            or obj in self._delayed_set
            or obj in self._running
            or obj in self._waiting
        )

    # ------------------------------------------------------------------ queueing

    def note(self, obj: ObjectMeta) -> None:
        """Look at `obj` at the next tick (repaired if it lacks replicas then)."""
        if not self.tracks(obj):
            self._ready[obj] = None

    def tick(self, now: float) -> int:
        """Start due repair copies within the limits; answers how many started."""
        if not self._max_in_flight:
            return 0
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, _, obj = heapq.heappop(delayed)
            if self._delayed_set.pop(obj, None) is not None:
                self._ready[obj] = None
        if self._waiting and now >= self._next_wait_retry:
            self._wake_waiting()
        if now >= self._next_wait_retry:
            self._next_wait_retry = now + _WAITING_RETRY_S
        budget = min(self._per_tick, self._max_in_flight - len(self._running))
        started = 0
        examined = 0
        ready = self._ready
        while ready and started < budget and examined < self._per_tick * _EXAMINE_FACTOR:
            obj = next(iter(ready))
            del ready[obj]
            examined += 1
            if self._start(obj, now):
                started += 1
        return started

    def _start(self, obj: ObjectMeta, now: float) -> bool:
        core = self._core
        if core.index.get(obj.tenant, obj.key) is not obj:
            self._attempts.pop(obj, None)  # removed or replaced meanwhile
            return False
        if not obj.complete or self._tasks.has_task(obj):
            self._delay(obj, now, self._backoff)  # being written, or another copy runs
            return False
        have = [r for r in obj.replicas if r.segment.alive]
        need = obj.replica_num - len(have)
        if need <= 0:
            self._attempts.pop(obj, None)
            return False
        source = next((r for r in have if r.kind is _MEMORY and r.readable()), None)
        if source is None:
            self._waiting[obj] = None  # only silent replicas: wait for their owner
            return False
        held = {r.segment for r in have}
        aligned = core.aligned(obj.size)
        candidates = [
            s for s in core.segments.live if s not in held and s.allocator.free_bytes >= aligned
        ]
        if not candidates:
            self._waiting[obj] = None  # nowhere to copy to: wait for a segment or room
            return False
        candidates.sort(key=_fill)
        targets = [s.name for s in candidates[:need]]
        task, code = self._tasks.start(
            TaskType.COPY,
            obj,
            source,
            targets,
            functools.partial(self._ended, obj),
            repair=True,
        )
        if task is None:
            log.debug("repair of %r not started (code %d)", obj.key, code)
            self._retry(obj, now)
            return False
        self._running[obj] = None
        return True

    def _ended(self, obj: ObjectMeta, ok: bool) -> None:
        self._running.pop(obj, None)
        if self._core.index.get(obj.tenant, obj.key) is not obj:
            self._attempts.pop(obj, None)  # removed: its copy failed with it, no failure
            return
        if ok:
            self.done += 1
            self._attempts.pop(obj, None)
            if sum(1 for r in obj.replicas if r.segment.alive) < obj.replica_num:
                self._ready[obj] = None  # still short (a target refused meanwhile): again
            return
        self.failed += 1
        self._retry(obj, self._core.clock())

    def _retry(self, obj: ObjectMeta, now: float) -> None:
        n = self._attempts.get(obj, 0) + 1
        if n >= self._max_attempts:
            self._attempts.pop(obj, None)
            log.warning("repair of %r given up after %d failed attempts", obj.key, n)
            return
        self._attempts[obj] = n
        self._delay(obj, now, min(self._backoff * 2.0 ** (n - 1), _MAX_BACKOFF_S))

    def _delay(self, obj: ObjectMeta, now: float, seconds: float) -> None:
        self._seq += 1
        due = now + seconds
        self._delayed_set[obj] = due
        heapq.heappush(self._delayed, (due, self._seq, obj))

    def _wake_waiting(self) -> None:
        self._ready.update(self._waiting)
        self._waiting.clear()

    def _forget(self, obj: ObjectMeta) -> None:
        self._ready.pop(obj, None)
        self._delayed_set.pop(obj, None)  # its heap entry is skipped when it comes due
        self._waiting.pop(obj, None)
        self._running.pop(obj, None)
        self._attempts.pop(obj, None)

    # ------------------------------------------------------------------ MetadataObserver

    @override
    def object_removed(self, obj: ObjectMeta) -> None:
        if self._ready or self._delayed_set or self._waiting or self._running:
            self._forget(obj)

    @override
    def replicas_lost(self, obj: ObjectMeta) -> None:
        if sum(1 for r in obj.replicas if r.segment.alive) < obj.replica_num:
            self.note(obj)

    @override
    def segment_mounted(self, seg: Segment) -> None:
        if self._waiting:
            self._wake_waiting()

    @override
    def segment_restored(self, seg: Segment) -> None:
        if self._waiting:
            self._wake_waiting()

    @override
    def segment_unmounted(self, seg: Segment) -> None:
        pass  # the sweep that follows reports what lost replicas

    @override
    def client_silenced(self, client_id: ClientId) -> None:
        pass  # a silent replica still counts: nothing is copied until its owner is dropped

    @override
    def client_expired(self, client_id: ClientId) -> None:
        pass


def _fill(seg: Segment) -> float:
    a = seg.allocator
    return a.allocated / a.capacity if a.capacity else 1.0
