"""The tiers below memory, on the master: offload to node disk tiers, promotion on hit, and
the registration of what a node's disk tier holds (docs/parts/tiers.md).

A node's disk tier is a segment of kind LOCAL_DISK (a preallocated file the node maps), kept
in `SegmentTable.disks`: nothing but this module allocates there. Bytes move through the
ordinary replica tasks (`task_table.py`), always executed by the disk segment's owner, which
journals what it wrote (`kvpool.client.disk`) so that it can name it again after a restart
(`RegisterDiskReplicas`):

* **eager** offload: every completed object is queued (bounded: the oldest are forgotten and
  counted past `offload_queue_limit`); each tick starts up to `offload_per_round` COPY tasks
  from a memory replica to a disk segment (the source's owner's first, then one on its host,
  then any with room).
* **on-evict**: reclaim asks `move_to_disk` before it would drop an object's last memory
  replica; a MOVE task replaces the memory replica by a disk one (pool mode: this is how
  eviction never loses; cache mode: the object stays readable from disk). When no disk can
  take it, cache mode drops it as before and pool mode keeps it.
* **promotion on hit**: reads that find no readable memory replica are counted per object (a
  bounded table, cleared when it overflows); the `promotion_admission_threshold`-th read
  queues the object, and each tick starts up to `promotion_per_round` COPY tasks from its disk
  replica to a memory segment chosen by placement. An object whose only copy is in the DFS
  directory is copied from its file by a client that said it sees the directory
  (`FetchTasks.dfs`: a node with `--dfs-root`, a Store with `dfs_root`), into one of its own
  segments when one has room; the DFS replica stays.

* **the disk tier's LRU** (`disk_lru.py`): when an offload or a move finds no disk with room,
  the oldest replicas of the best disk segment are dropped until the object fits (at most
  `DISK_EVICT_SCAN` looked at): never a hard-pinned object's, nor one being read (lease) or
  copied (task); in pool mode only a replica whose object stays readable from another one
  (pool mode never loses an object). A disk replica that was the object's last takes the
  object with it (cache mode).

Everything runs on the master's loop; work is bounded per tick and by `offload_max_in_flight`.
"""

from __future__ import annotations

import logging
from collections import deque

from kvpool.codes import CLIENT_NOT_FOUND, INVALID_PARAMS, OK, SEGMENT_NOT_FOUND
from kvpool.master.config import EvictionMode
from kvpool.master.core import MetadataCore
from kvpool.master.dfs import DfsTier
from kvpool.master.disk_lru import DiskLru
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.quota import TenantQuotas
from kvpool.master.segments import Segment
from kvpool.master.task_table import TaskDone, TaskTable
from kvpool.master.tier_config import OffloadPolicy, TierConfig
from kvpool.protocol.messages import (
    ClientId,
    CountReply,
    RegisterDiskReplicas,
    ReplicaKind,
    ReplicaStatus,
    SegmentName,
    TaskType,
)

__all__ = ["TierManager"]

log = logging.getLogger(__name__)

_MEMORY = ReplicaKind.MEMORY
RETRY_HINT_MS = 20
"""A put refused while memory moves to disk asks again after this long (within its window)."""
_COMPLETE = ReplicaStatus.COMPLETE
DISK_EVICT_SCAN = 64
"""Disk replicas looked at, oldest first, to make room for one offload (a bound per call)."""
MAX_DFS_EXECUTORS = 4096
"""Clients remembered as seeing the DFS directory at most (those gone are pruned first)."""
_ROOM_HINT = 1 << 20
"""Free bytes on a disk that count as room for a refused put's retry hint."""


class TierManager:
    """Offload, promotion and disk registration (module docstring); owned by the service."""

    def __init__(self, core: MetadataCore, tasks: TaskTable, config: TierConfig) -> None:
        self._core = core
        self._tasks = tasks
        self.config = config
        self._offload: deque[ObjectMeta] = deque()
        self._promote: deque[ObjectMeta] = deque()
        self._hits: dict[ObjectMeta, int] = {}
        self.in_flight = 0
        #: The tenant quotas in force (None: none): an eager offload or a promotion, a new
        #: replica its tenant did not ask for, is skipped while it would take the tenant past
        #: its quota (`kvpool.master.quota`).
        self.quotas: TenantQuotas | None = None
        self._freed: dict[ClientId, list[tuple[SegmentName, int]]] = {}
        self._lru = DiskLru()
        self._dfs_executors: dict[ClientId, None] = {}
        """Clients that see the DFS directory (an ordered set): they promote from DFS."""
        self.dfs = (
            DfsTier(
                core,
                config.dfs_root,
                config.dfs_check_per_round,
                check_interval=config.dfs_check_interval,
                orphan_grace=config.dfs_orphan_grace,
            )
            if config.dfs_root
            else None
        )
        """The DFS tier (`--dfs-root`), or None."""
        #: Counters (stats, tests): offloaded, offload_failed, offload_dropped, moved_to_disk,
        #: promoted, promote_failed, disk_reads, registered, disk_evicted (replicas the disk
        #: LRU dropped), disk_full (offloads that found no room even so).
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "offloaded",
                "offload_failed",
                "offload_dropped",
                "moved_to_disk",
                "promoted",
                "promote_failed",
                "disk_reads",
                "registered",
                "disk_evicted",
                "disk_full",
            ),
            0,
        )

    @property
    def has_disks(self) -> bool:
        return bool(self._core.segments.disks)

    # ------------------------------------------------------------------ events

    def note_complete(self, obj: ObjectMeta) -> None:
        """`obj` became readable from memory (PutEnd, PutCommit)."""
        if self.dfs is not None:
            self.dfs.on_complete(obj)
        if self.config.offload_policy is not OffloadPolicy.EAGER or not self.has_disks:
            return
        q = self._offload
        if len(q) >= self.config.offload_queue_limit:
            q.popleft()
            self.counters["offload_dropped"] += 1
        q.append(obj)

    def note_read(self, obj: ObjectMeta) -> None:
        """A read of `obj` was served with no readable memory replica (from disk)."""
        self.counters["disk_reads"] += 1
        self._lru.touch(obj)
        cfg = self.config
        if not cfg.promotion_on_hit:
            return
        hits = self._hits
        n = hits.get(obj, 0) + 1
        if n >= cfg.promotion_admission_threshold:
            hits.pop(obj, None)
            if len(self._promote) < cfg.offload_queue_limit:
                self._promote.append(obj)
            return
        if len(hits) >= cfg.promotion_table_limit:
            hits.clear()  # bounded: hot objects earn their count again quickly
        hits[obj] = n

    def note_disk_free(self, seg: Segment, offset: int) -> None:
        """A disk-tier range was freed: its owner learns it with its next FetchTasks
        (bounded per client: past `offload_queue_limit` the oldest are forgotten, and such an
        object may come back from its node's journal after a restart)."""
        dfs = self.dfs
        if dfs is not None and seg is dfs.segment:
            dfs.on_free(offset)
            return
        self._lru.remove(seg, offset)
        q = self._freed.setdefault(seg.client_id, [])
        if len(q) >= self.config.offload_queue_limit:
            del q[: len(q) // 2]
        q.append((seg.name, offset))

    def restored(self, done: list[tuple[ObjectMeta, Replica]]) -> None:
        """Disk-tier and DFS replicas came back with a master restart or a promoted standby
        (`durable.build`): the disk LRU and the DFS check know them again."""
        dfs = self.dfs
        for obj, r in done:
            if dfs is not None and r.segment is dfs.segment:
                dfs.restore(obj, r)
            else:
                self._lru.add(obj)

    def note_fetch(self, client_id: ClientId, sees_dfs: bool) -> None:
        """The client fetched its tasks, saying whether it sees the DFS directory (a node
        with `--dfs-root`, a Store with `dfs_root`): those run promotions from DFS files."""
        if not sees_dfs or self.dfs is None or client_id in self._dfs_executors:
            return
        if len(self._dfs_executors) >= MAX_DFS_EXECUTORS:
            self._prune_dfs_executors()
            if len(self._dfs_executors) >= MAX_DFS_EXECUTORS:
                return  # bounded; those known keep the work
        self._dfs_executors[client_id] = None

    def _prune_dfs_executors(self) -> list[ClientId]:
        """Forget DFS executors the master no longer knows; the others, not silent ones."""
        clients = self._core.clients
        out: list[ClientId] = []
        for cid in list(self._dfs_executors):
            rec = clients.get(cid)
            if rec is None:
                del self._dfs_executors[cid]
            elif not rec.silent:
                out.append(cid)
        return out

    def take_freed(self, client_id: ClientId) -> list[tuple[SegmentName, int]]:
        """The client's freed disk ranges since the last call (FetchTasks hands them out)."""
        return self._freed.pop(client_id, []) if self._freed else []

    # ------------------------------------------------------------------ work

    def tick(self) -> int:
        """Start due offload and promotion tasks (bounded); answers how many started."""
        cfg = self.config
        started = 0
        self._lru.prune()
        if self.dfs is not None:
            self.dfs.tick(self._core.clock())
        budget = min(cfg.offload_per_round, cfg.offload_max_in_flight - self.in_flight)
        q = self._offload
        while q and budget > 0:
            obj = q.popleft()
            if not self._current(obj) or self._has_disk(obj) or not self._room(obj):
                continue
            source = _memory_replica(obj)
            if source is None:
                continue
            if self._to_disk(obj, source, TaskType.COPY, self._done("offloaded", "offload_failed")):
                started += 1
                budget -= 1
        budget = min(cfg.promotion_per_round, cfg.offload_max_in_flight - self.in_flight)
        p = self._promote
        while p and budget > 0:
            obj = p.popleft()
            if not self._current(obj) or _memory_replica(obj) is not None or not self._room(obj):
                continue
            if self._promote_one(obj):
                started += 1
                budget -= 1
        return started

    def move_to_disk(self, obj: ObjectMeta, replica: Replica, on_done: TaskDone | None) -> bool:
        """On-evict: start moving the memory `replica` of `obj` to a disk tier; False (nothing
        changed) when the policy is not on-evict or no disk can take it."""
        if self.config.offload_policy is OffloadPolicy.OFF or not self.has_disks:
            return False
        if self.in_flight >= self.config.offload_max_in_flight:
            return False
        counted = self._done("moved_to_disk", "offload_failed")

        def done(ok: bool) -> None:
            counted(ok)
            if on_done is not None:
                on_done(ok)

        return self._to_disk(obj, replica, TaskType.MOVE, done)

    def evict(self, obj: ObjectMeta) -> int:
        """Reclaim takes `obj` out of memory; answers the bytes freed now. With a readable
        disk replica only the memory replicas go (the object stays readable from disk);
        on-evict without one, a MOVE to disk starts (0 now: its memory is freed when the move
        ends); otherwise the object is dropped, as before tiers."""
        core = self._core
        if any(r.kind is not _MEMORY and r.readable() for r in obj.replicas):
            freed = 0
            for r in [r for r in obj.replicas if r.kind is _MEMORY]:
                freed += core.drop_replica(obj, r)
            return freed
        if self.config.offload_policy is OffloadPolicy.ON_EVICT:
            source = _memory_replica(obj)
            if source is not None and self.move_to_disk(obj, source, None):
                return 0
        return core.free_object(obj)

    def dfs_replica(self, size: int) -> Replica | None:
        """A put asked for a DFS copy: its PROCESSING DFS replica (None without a DFS tier)."""
        return self.dfs.allocate(size) if self.dfs is not None else None

    def retry_hint(self) -> int:
        """Milliseconds a put refused for want of memory should wait and ask again: moves to
        disk (on-evict) are under way or can be started, so memory is coming; 0 otherwise
        (every disk full of what may not be dropped: the put fails now, NO_AVAILABLE_HANDLE,
        rather than asking again for its whole window)."""
        if self.config.offload_policy is not OffloadPolicy.ON_EVICT or not self.has_disks:
            return 0
        if self.in_flight or any(self._may_take(seg) for seg in self._core.segments.disks):
            return RETRY_HINT_MS
        return 0

    def _may_take(self, seg: Segment) -> bool:
        """Whether disk segment `seg` has room for a 1 MiB object, or can make some (one of
        its oldest replicas may be dropped)."""
        if seg.allocator.largest_free() >= _ROOM_HINT:
            return True
        core = self._core
        now = core.clock()
        pool = core.config.eviction_mode is EvictionMode.POOL
        for offset, victim in self._lru.oldest(seg, DISK_EVICT_SCAN):
            if victim.hard_pin or now < victim.lease_deadline or self._tasks.has_task(victim):
                continue
            if not pool or any(
                r.readable() and not (r.segment is seg and r.offset == offset)
                for r in victim.replicas
            ):
                return True
        return False

    def _current(self, obj: ObjectMeta) -> bool:
        core = self._core
        return (
            obj.complete
            and core.index.get(obj.tenant, obj.key) is obj
            and not self._tasks.has_task(obj)
        )

    def _room(self, obj: ObjectMeta) -> bool:
        """Whether one more replica of `obj` keeps its tenant within its quota."""
        limit = self.quotas.limit(obj.tenant) if self.quotas is not None else None
        return limit is None or self._core.index.tenant_bytes.get(obj.tenant, 0) + obj.size <= limit

    @staticmethod
    def _has_disk(obj: ObjectMeta) -> bool:
        return any(r.kind is not _MEMORY and r.segment.alive for r in obj.replicas)

    def _done(self, ok_name: str, fail_name: str) -> TaskDone:
        self.in_flight += 1

        def done(ok: bool) -> None:
            self.in_flight -= 1
            self.counters[ok_name if ok else fail_name] += 1

        return done

    def _to_disk(
        self, obj: ObjectMeta, source: Replica, task_type: TaskType, on_done: TaskDone
    ) -> bool:
        seg = self._disk_for(obj, source.segment) or self._make_room(obj, source.segment)
        if seg is None:
            self.in_flight -= 1  # `_done` counted a task that never started
            return False
        lru = self._lru

        def done(ok: bool) -> None:
            if ok:
                lru.add(obj)
            on_done(ok)

        task, code = self._tasks.start(
            task_type, obj, source, [seg.name], done, repair=True, executor=seg.client_id
        )
        if task is None:
            self.in_flight -= 1
            log.debug("offload of %r to %s refused: %d", obj.key, seg.name, code)
            return False
        return True

    def _disk_for(self, obj: ObjectMeta, home: Segment) -> Segment | None:
        """A serving disk segment with room for `obj`, not holding it: the owner of `home`'s,
        then one on `home`'s host, then any; among equals the one with the most free bytes
        (a node with several `--offload-dir` fills them evenly)."""
        aligned = self._core.aligned(obj.size)
        held = {r.segment for r in obj.replicas}
        clients = self._core.clients
        best: Segment | None = None
        best_key = (3, 0)
        for seg in self._core.segments.disks:
            if seg in held or seg.allocator.largest_free() < aligned:
                continue
            rec = clients.get(seg.client_id)
            if rec is None or rec.silent:
                continue
            rank = 0 if seg.client_id == home.client_id else 1 if seg.host_id == home.host_id else 2
            key = (rank, -seg.allocator.free_bytes)
            if key < best_key:
                best, best_key = seg, key
        return best

    def _make_room(self, obj: ObjectMeta, home: Segment) -> Segment | None:
        """No disk has room for `obj`: drop the least recently used replicas of the disk
        segments that could take it (ranked as in `_disk_for`) until one does; that segment,
        or None (counted: disk_full)."""
        aligned = self._core.aligned(obj.size)
        held = {r.segment for r in obj.replicas}
        clients = self._core.clients
        ranked: list[tuple[int, Segment]] = []
        for seg in self._core.segments.disks:
            if seg in held or seg.size < aligned:
                continue
            rec = clients.get(seg.client_id)
            if rec is None or rec.silent:
                continue
            rank = 0 if seg.client_id == home.client_id else 1 if seg.host_id == home.host_id else 2
            ranked.append((rank, seg))
        ranked.sort(key=lambda t: t[0])
        for _, seg in ranked:
            if self._evict_from(seg, aligned):
                return seg
        self.counters["disk_full"] += 1
        return None

    def _evict_from(self, seg: Segment, aligned: int) -> bool:
        """Drop the oldest droppable replicas of disk segment `seg` (module docstring) until
        a block of `aligned` bytes is free there; whether one is."""
        core = self._core
        now = core.clock()
        pool = core.config.eviction_mode is EvictionMode.POOL
        alloc = seg.allocator
        for offset, victim in self._lru.oldest(seg, DISK_EVICT_SCAN):
            if alloc.largest_free() >= aligned:
                return True
            replica = next(
                (r for r in victim.replicas if r.segment is seg and r.offset == offset), None
            )
            if replica is None or core.index.get(victim.tenant, victim.key) is not victim:
                self._lru.remove(seg, offset)  # stale: the range went another way
                continue
            if (
                victim.hard_pin
                or not victim.complete
                or now < victim.lease_deadline
                or self._tasks.has_task(victim)
            ):
                continue
            others = any(r is not replica and r.readable() for r in victim.replicas)
            if not others and pool:
                continue  # pool mode never loses an object
            if others:
                core.drop_replica(victim, replica)
            else:
                core.free_object(victim)
            self._lru.remove(seg, offset)
            self.counters["disk_evicted"] += 1
        return alloc.largest_free() >= aligned

    def _promote_one(self, obj: ObjectMeta) -> bool:
        source = next(
            (r for r in obj.replicas if r.kind is ReplicaKind.LOCAL_DISK and r.readable()), None
        )
        if source is None:
            return self._promote_from_dfs(obj)
        aligned = self._core.aligned(obj.size)
        live = self._core.segments.live
        targets = sorted(
            (s for s in live if s.allocator.largest_free() >= aligned),
            key=lambda s: (s.host_id != source.segment.host_id, s.allocator.allocated),
        )
        for seg in targets[:2]:
            on_done = self._done("promoted", "promote_failed")
            task, _code = self._tasks.start(
                TaskType.COPY,
                obj,
                source,
                [seg.name],
                on_done,
                repair=True,
                executor=source.segment.client_id,
            )
            if task is not None:
                return True
            self.in_flight -= 1
        return False

    def _promote_from_dfs(self, obj: ObjectMeta) -> bool:
        """A COPY of `obj`'s DFS file into memory, run by a client that sees the DFS
        directory (`note_fetch`): into one of its own segments when one has room (a local
        write), else into the emptiest segment (the executor writes it over the network)."""
        dfs = self.dfs
        if dfs is None or not self._dfs_executors:
            return False
        source = next((r for r in obj.replicas if r.segment is dfs.segment and r.readable()), None)
        if source is None:
            return False
        executors = self._prune_dfs_executors()
        if not executors:
            return False
        mine = set(executors)
        aligned = self._core.aligned(obj.size)
        targets = sorted(
            (s for s in self._core.segments.live if s.allocator.largest_free() >= aligned),
            key=lambda s: (s.client_id not in mine, s.allocator.allocated),
        )
        for seg in targets[:2]:
            executor = seg.client_id if seg.client_id in mine else executors[0]
            on_done = self._done("promoted", "promote_failed")
            task, _code = self._tasks.start(
                TaskType.COPY, obj, source, [seg.name], on_done, repair=True, executor=executor
            )
            if task is not None:
                return True
            self.in_flight -= 1
        return False

    # ------------------------------------------------------------------ registration

    def register(self, req: RegisterDiskReplicas) -> CountReply:
        """`RegisterDiskReplicas`: the node's disk segment holds `req.entries` (verified)."""
        core = self._core
        if core.clients.get(req.client_id) is None:
            return CountReply(CLIENT_NOT_FOUND)
        seg = core.segments.get(req.segment)
        if seg is None or seg.client_id != req.client_id:
            return CountReply(SEGMENT_NOT_FOUND)
        if seg.kind is _MEMORY:
            return CountReply(INVALID_PARAMS)
        now = core.clock()
        count = 0
        for e in req.entries:
            if e.size <= 0 or e.offset < 0 or e.offset + e.size > seg.size:
                continue
            obj = core.index.get(e.tenant, e.key)
            if obj is not None and (
                not obj.complete
                or obj.size != e.size
                or obj.checksum != e.checksum
                or any(r.segment is seg for r in obj.replicas)
            ):
                continue  # another object now holds the key, or this replica is known
            if not seg.allocator.alloc_at(e.offset, e.size):
                continue
            seg.objects += 1
            replica = Replica(seg, e.offset, _COMPLETE, seg.kind)
            if obj is None:
                t = core.index.tenant_for_insert(e.tenant)
                shard = t.shard_of(e.key)
                obj = ObjectMeta(
                    e.key, e.tenant, shard, e.size, req.client_id, (), now, None, False, ""
                )
                obj.complete = True
                obj.checksum = e.checksum
                core.index.add(t.shards[shard], obj)
            core.add_replicas(obj, (replica,))
            self._lru.add(obj)
            count += 1
        self.counters["registered"] += count
        log.info("segment %s: %d disk replica(s) registered", seg.name, count)
        return CountReply(OK, count)


def _memory_replica(obj: ObjectMeta) -> Replica | None:
    return next((r for r in obj.replicas if r.kind is _MEMORY and r.readable()), None)
