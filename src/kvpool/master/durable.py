"""Durable metadata: what `MetadataCore` logs (`Journal`), and the restart that reads it back.

`MetadataCore.journal` is None without `--data-dir` (the hot paths test it once and pay
nothing more); with one it is a `Journal` (`oplog.py`), told of each durable change by the core's named
operations. `Durability` owns the log, the snapshots (a forked child writes the state while
the loop goes on) and the restart (`recover`): the newest complete snapshot, then the logs
after it; every restored segment is *silent* (docs/parts/ha.md, "Durable metadata") until its
node remounts it with the same generation.
"""

from __future__ import annotations

import bisect
import gc
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.oplog import (
    DrainRec,
    FlightRec,
    GoneRec,
    Journal,
    ObjRec,
    OpLog,
    OpLogCorrupt,
    ParkRec,
    Rec,
    SegRec,
    Where,
    list_files,
    obj_rec,
    read_records,
    seg_rec,
    where,
    write_snapshot,
)
from kvpool.master.segments import Segment
from kvpool.protocol.messages import (
    ClientId,
    HostId,
    ReplicaKind,
    ReplicaStatus,
    SegmentInfo,
    SegmentName,
)
from kvpool.protocol.tiers import DFS_SEGMENT

if TYPE_CHECKING:
    from kvpool.master.core import MetadataCore

__all__ = ["Durability", "Replay", "build", "state_records"]

log = logging.getLogger(__name__)

_COMPLETE = ReplicaStatus.COMPLETE
DFS_MOUNT = 0
"""The mount number of the DFS tier's segment in a `Replay` (real mounts count from 1): it
belongs to no node, is never mounted or unmounted, and its replicas are files that outlive every
node (docs/parts/tiers.md, "The DFS tier")."""

Restored = Callable[[list[tuple[ObjectMeta, Replica]]], None]
"""Told of the disk-tier and DFS replicas a restart (or a promoted standby) brought back."""


class Replay:
    """The state the records describe, keyed by mount (a name mounted again is a new mount)."""

    def __init__(self) -> None:
        self.mount_no = 0
        self.mounts: dict[str, tuple[int, SegRec]] = {}
        self.objects: dict[tuple[str, str], tuple[ObjRec, list[tuple[int, int]]]] = {}
        self.parks: list[tuple[float, int, list[tuple[int, int]]]] = []
        self.flights: dict[tuple[str, str], tuple[float, int, list[tuple[int, int]]]] = {}
        #: Drains under way by segment name (of the mount in `mounts` with their generation).
        self.drains: dict[str, DrainRec] = {}

    def _resolve(self, ranges: list[Where]) -> list[tuple[int, int]]:
        out = []
        for name, gen, off in ranges:
            if name == DFS_SEGMENT:
                out.append((DFS_MOUNT, off))
                continue
            m = self.mounts.get(name)
            if m is not None and m[1].generation == gen:
                out.append((m[0], off))
        return out

    def apply(self, rec: Rec) -> None:
        if isinstance(rec, ObjRec):
            self.objects[rec.tenant, rec.key] = (rec, self._resolve(rec.replicas))
            self.flights.pop((rec.tenant, rec.key), None)
        elif isinstance(rec, GoneRec):
            self.objects.pop((rec.tenant, rec.key), None)
            self.flights.pop((rec.tenant, rec.key), None)
        elif isinstance(rec, FlightRec):
            # An UpsertStart in place: the object is unreadable until its PutEnd.
            self.objects.pop((rec.tenant, rec.key), None)
            self.flights[rec.tenant, rec.key] = (rec.until, rec.size, self._resolve(rec.ranges))
        elif isinstance(rec, ParkRec):
            self.parks.append((rec.until, rec.size, self._resolve(rec.ranges)))
        elif isinstance(rec, SegRec):
            m = self.mounts.get(rec.name)
            if m is not None and m[1].generation == rec.generation:
                # The same memory named again (a fuzzy snapshot followed by the log that
                # overlaps it, a revived node): its objects stay where they are.
                self.mounts[rec.name] = (m[0], rec)
                return
            self.mount_no += 1
            self.mounts[rec.name] = (self.mount_no, rec)
            self.drains.pop(rec.name, None)  # a new mount of the name is not draining
        elif isinstance(rec, DrainRec):
            m = self.mounts.get(rec.name)
            if m is not None and m[1].generation == rec.generation:
                self.drains[rec.name] = rec
        else:
            m = self.mounts.get(rec.name)
            if m is not None and m[1].generation == rec.generation:
                del self.mounts[rec.name]
                self.drains.pop(rec.name, None)


class Durability:
    """The data directory of one master: its log, its snapshots and its restart."""

    def __init__(
        self,
        core: MetadataCore,
        data_dir: str,
        fsync_interval: float,
        arena_ranges: Callable[[], Iterable[tuple[Segment, int, int]]],
        wall: Callable[[], float] = time.time,
        *,
        dfs: Segment | None = None,
        restored: Restored | None = None,
    ) -> None:
        self._core = core
        self._dfs = dfs
        self._restored = restored
        self._dir = Path(data_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._wall = wall
        self._arena_ranges = arena_ranges
        self._child: tuple[int, int] | None = None
        # Millions of new records and no cycles among them: without the collector off, each
        # full collection walks all of them, and loading takes several times longer.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            seq = self.recover()
        finally:
            if was_enabled:
                gc.enable()
        self.log = OpLog(self._dir, seq, fsync_interval, core.clock)
        self.journal = Journal(self.log, core.clock, wall)
        # The state just loaded becomes snapshot `seq`: later restarts read it, not the logs.
        write_snapshot(self._dir / f"snapshot-{seq:08d}.kvp", seq, self.records())
        self._drop_before(seq)
        core.journal = self.journal

    # ------------------------------------------------------------------ restart

    def recover(self) -> int:
        """Load the newest complete snapshot and the logs after it; answers the next seq."""
        snaps = list_files(self._dir, "snapshot")
        logs = list_files(self._dir, "log")
        state = Replay()
        base = 0
        for seq, path in reversed(snaps):
            try:
                attempt = Replay()
                for rec in read_records(path, tolerate_tail=False):
                    attempt.apply(rec)
            except OpLogCorrupt:
                log.warning("snapshot %s is damaged; trying an older one", path)
                continue
            state, base = attempt, seq
            break
        todo = [(s, p) for s, p in logs if s >= base]
        for i, (_, path) in enumerate(todo):
            for rec in read_records(path, tolerate_tail=i == len(todo) - 1):
                state.apply(rec)
        self._build(state)
        last = max([s for s, _ in snaps] + [s for s, _ in logs], default=0)
        log.info(
            "restored %d objects on %d segment(s) from %s (all silent until remounted)",
            len(self._core.index),
            len(state.mounts),
            self._dir,
        )
        return last + 1

    def _build(self, state: Replay) -> None:
        build(self._core, state, self._wall(), self._dfs, self._restored)

    # ------------------------------------------------------------------ snapshots

    def records(self) -> Iterator[Rec]:
        """The current state as records (segments, complete objects, parked and lent ranges)."""
        return state_records(self._core, self.journal.to_wall, self._arena_ranges)

    # ------------------------------------------------------------------ files

    def snapshot(self) -> bool:
        """Rotate the log and fork a child that writes the state as of now; False while the
        previous child still runs."""
        if self._child is not None and not self.poll():
            return False
        seq = self.log.rotate()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                write_snapshot(self._dir / f"snapshot-{seq:08d}.kvp", seq, self.records())
                code = 0
            finally:
                os._exit(code)
        self._child = (pid, seq)
        return True

    def poll(self) -> bool:
        """Reap a finished snapshot child (then drop the files it made useless); True when
        none is running any more."""
        if self._child is None:
            return True
        pid, seq = self._child
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            return False
        self._child = None
        if os.waitstatus_to_exitcode(status) == 0:
            self._drop_before(seq)
        else:
            log.error("snapshot %d failed (status %d); the logs are kept", seq, status)
        return True

    def _drop_before(self, seq: int) -> None:
        """Delete the files a complete snapshot `seq` made useless (and any half-written
        snapshot of a killed child)."""
        if self._child is None:
            for tmp in self._dir.glob("snapshot-*.tmp"):
                tmp.unlink(missing_ok=True)
        for kind in ("snapshot", "log"):
            for s, p in list_files(self._dir, kind):
                if s < seq:
                    p.unlink(missing_ok=True)

    def sync_due(self) -> int | None:
        """See `OpLog.sync_due`."""
        return self.log.sync_due()

    def close(self) -> None:
        """Wait for a snapshot child, sync and close the log (idempotent)."""
        if self._child is not None:
            os.waitpid(self._child[0], 0)
            self._child = None
        self._core.journal = None
        self.log.close()


def state_records(
    core: MetadataCore,
    to_wall: Callable[[float], float],
    arena_ranges: Callable[[], Iterable[tuple[Segment, int, int]]],
) -> Iterator[Rec]:
    """`core`'s state as records: segments, complete objects, parked, in-flight and lent
    ranges. Walked lazily (a standby's snapshot is sent in chunks across loop turns): each
    record is the state when it is made, and every change after the walk began is also in the
    log after that point, so the snapshot followed by that log converges (records set state)."""
    for seg in core.segments.mounted():
        yield seg_rec(seg)
    for seg in core.segments.mounted():
        drain = core.draining.get(seg.name)
        if drain is not None and seg.draining:
            yield DrainRec(seg.name, seg.generation, to_wall(drain[0]), drain[1])
    for obj in core.index.snapshot():
        if obj.complete:
            yield obj_rec(obj, to_wall)
    now = core.clock()
    for until, _, size, reps in list(core.parked._heap):
        if until > now:
            yield ParkRec(to_wall(until), size, [where(r) for r in reps if r.segment.alive])
    for obj in [o for b in core.clients.in_flight.values() for o in b]:
        until = obj.put_start_time + core.config.put_start_release_timeout
        yield FlightRec(
            obj.tenant, obj.key, to_wall(until), obj.size, [where(r) for r in obj.replicas]
        )
    lent_until = to_wall(now + core.config.put_start_release_timeout)
    for seg, off, size in arena_ranges():
        yield ParkRec(lent_until, size, [(seg.name, seg.generation, off)])


def build(
    core: MetadataCore,
    state: Replay,
    wall: float,
    dfs: Segment | None = None,
    restored: Restored | None = None,
) -> None:
    """Load `state` into the empty `core`: every segment mounted and silent until its node
    remounts it with the same generation (a disk tier's as LOCAL_DISK again), objects on them,
    parked ranges kept until their (wall-clock) time; `wall` is the wall clock now. DFS
    replicas go on `dfs` (the master's DFS segment; dropped without one: no `--dfs-root`), and
    `restored` is told of the disk and DFS replicas brought back."""
    now = core.clock()
    segs: dict[int, Segment] = {}
    recs = []
    for no, m in state.mounts.values():
        rec = core.register_client(ClientId(m.client_id), HostId(m.host_id), now)
        info = SegmentInfo(
            SegmentName(m.name),
            m.size,
            HostId(m.host_id),
            m.endpoint,
            m.shm_path,
            ClientId(m.client_id),
            m.generation,
            ReplicaKind(m.kind),
        )
        core.mount_segment(rec, info)
        seg = core.segments.get(info.name)
        if seg is not None:
            segs[no] = seg
            recs.append(rec)
    # Replicas by segment, sorted by offset; one overlapping an earlier one is dropped
    # (it cannot happen in a log this master wrote, but a bad range must not corrupt two).
    nodes = dict(segs)  # the segments of nodes (silenced below); DFS replicas have none
    if dfs is not None:
        segs[DFS_MOUNT] = dfs
    claims: dict[int, list[tuple[int, int, int]]] = {no: [] for no in segs}
    objs = list(state.objects.values())
    for i, (o, ranges) in enumerate(objs):
        aligned = core.aligned(o.size)
        for no, off in ranges:
            if no in claims and off >= 0 and off + aligned <= segs[no].allocator.capacity:
                claims[no].append((off, off + aligned, i))
    kept: dict[int, list[int]] = {}
    used: dict[int, list[tuple[int, int]]] = {}
    for no, lst in claims.items():
        lst.sort()
        end = 0
        used[no] = []
        for lo, hi, i in lst:
            if lo >= end:
                kept.setdefault(i, []).append(no)
                used[no].append((lo, hi))
                end = hi
    done: list[tuple[ObjectMeta, Replica]] = []
    for i, (o, ranges) in enumerate(objs):
        nos = kept.get(i)
        if not nos:
            continue
        reps = tuple(
            Replica(segs[no], off, _COMPLETE, segs[no].kind) for no, off in ranges if no in nos
        )
        for r in reps:
            r.segment.objects += 1
        t = core.index.tenant_for_insert(o.tenant)
        obj = ObjectMeta(
            o.key,
            o.tenant,  # type: ignore[arg-type]
            t.shard_of(o.key),
            o.size,
            ClientId(""),
            reps,
            now,
            o.soft_pin_ttl,
            o.hard_pin,
            o.group_id,
            o.replica_num,
        )
        obj.complete = True
        obj.checksum = o.checksum
        if o.pin_until is not None:
            obj.soft_pin_deadline = o.pin_until - wall + now
        core.index.insert(obj)
        done.extend((obj, r) for r in reps)
    # Latest first: where parks overlap, the longest one holds the range.
    pieces: list[tuple[Segment, int, int, float]] = []
    parks = state.parks + list(state.flights.values())
    for until, size, ranges in sorted(parks, key=lambda p: -p[0]):
        if until <= wall:
            continue
        for no, off in ranges:
            if no in used:
                hi = min(off + core.aligned(size), segs[no].allocator.capacity)
                for a, b in list(_gaps(off, hi, used[no])):
                    bisect.insort(used[no], (a, b))
                    pieces.append((segs[no], a, b - a, until - wall + now))
    # Each allocator is rebuilt in one pass: all taken, then every gap freed (alloc_at
    # per replica is O(free blocks), quadratic on a fragmented segment).
    for no, seg in segs.items():
        alloc = seg.allocator
        if alloc.capacity:
            alloc.alloc_at(0, alloc.capacity)
            for a, b in _gaps(0, alloc.capacity, used[no]):
                alloc.free(a, b - a)
    for seg, off, size, until in pieces:
        core.park_range(seg, off, size, until)
    if done:
        core.hooks.on_replicas_complete(done)
        tiers = [(o, r) for o, r in done if r.kind is not ReplicaKind.MEMORY]
        if tiers and restored is not None:
            restored(tiers)
    for rec in recs:
        rec.silent = True
    for seg in nodes.values():
        core.segments.silence(seg)
    for seg in nodes.values():
        drain = state.drains.get(seg.name)
        if drain is not None and drain.generation == seg.generation:
            # Resumed by the drain table's next tick (`DrainTable.adopt`), to the same end.
            core.segments.drain(seg)
            core.draining[seg.name] = (drain.until - wall + now, drain.grace)


def _gaps(lo: int, hi: int, used: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The parts of [lo, hi) outside the sorted, disjoint ranges `used`."""
    i = max(0, bisect.bisect_left(used, (lo, lo)) - 1)
    pos = lo
    while i < len(used) and used[i][0] < hi:
        a, b = used[i]
        if b > pos:
            if a > pos:
                yield pos, a
            pos = max(pos, b)
        i += 1
    if pos < hi:
        yield pos, hi
