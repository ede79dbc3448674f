"""The reclaim engine: heat tracking on the online path, kswapd and direct reclaim off it.

`ReclaimEngine` owns one `ReclaimLists` per metadata shard and drives them against a
`ReclaimTarget` (the metadata owner). Three kinds of callers:

* the online path (PutEnd → `on_complete`, a read hit → `on_access`, Remove → `on_remove`):
  O(1) under one shard's list lock, no scan, no I/O, no metadata lookup;
* kswapd (`kswapd_step`, run from the master's reclaim tick by `adapter.MasterReclaimHooks`,
  or by a benchmark between operations): wanted when used bytes pass the high watermark or
  after an allocation failure, it reclaims toward the low watermark in bounded steps,
  shrinking active (balance) and then inactive;
* direct reclaim (`direct_reclaim`, from PutStart when allocation failed): synchronous,
  inactive lists only, so that a burst of puts cannot scatter the hot set. Concurrent callers
  share one pass (group commit): the first becomes the leader and reclaims the sum of what
  everyone waiting asked for; the others wait for that pass and retry their allocation.

A pass splits its byte target across shards by their share of resident bytes; a reclaim of a
few records (one put's direct reclaim) goes to one shard drawn with that probability, so it
takes one shard's lock, not all of them. Per shard it isolates batches from the tail of
inactive, asks the target about each record outside the list lock, and evicts, keeps (rotates)
or drops the record. Soft-pinned records (cache mode) are parked on their shard's soft-pinned
ring and evicted only when no shard could cover the request otherwise: "last" is pool-wide.
Work per evicted object does not depend on how many objects are resident; only on how many
ineligible records had to be looked at.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Generic

import xxhash

from kvpool.master.reclaim.base import ReclaimTarget, Verdict
from kvpool.master.reclaim.config import EvictionMode, ReclaimConfig
from kvpool.master.reclaim.lists import ReclaimLists, RecordIndex, ShardUsage
from kvpool.master.reclaim.records import ISOLATED_BITS, REF, STATE_MASK, EvictInfo, K, ListState

__all__ = ["ReclaimEngine", "ReclaimResult", "ReclaimStats", "hash_shard_of"]

log = logging.getLogger(__name__)

# Freed bytes of the last this-many direct-reclaim groups, for followers that wake late.
_GROUP_RESULTS_KEPT = 64
# Reclaims up to this many average records go to one shard drawn by usage (see `_split`).
_SMALL_RECLAIM_RECORDS = 4
# A larger pass visits at most about this many shards (see `_split`).
_MAX_SHARDS_PER_PASS = 16
# Compared per record a pass decides about: module constants (`Verdict.X` is an
# EnumType.__getattr__ call on Python 3.11).
_STALE = Verdict.STALE
_HARD_PINNED = Verdict.HARD_PINNED
_LEASED = Verdict.LEASED
_BUSY = Verdict.BUSY
_SOFT_PINNED = Verdict.SOFT_PINNED
_DROPPABLE = Verdict.DROPPABLE
_CACHE = EvictionMode.CACHE


@dataclass(slots=True)
class ReclaimStats:
    """Counters since start, for status and metrics (plain ints: approximate only when several
    threads run passes at once)."""

    kswapd_steps: int = 0
    direct_calls: int = 0
    direct_passes: int = 0
    direct_refused: int = 0
    isolated: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    dropped: int = 0
    soft_pinned_evicted: int = 0
    swap_outs_started: int = 0
    swap_outs_moved: int = 0
    swap_outs_failed: int = 0
    swap_outs_refused: int = 0
    stale: int = 0
    kept_referenced: int = 0
    kept_leased: int = 0
    kept_busy: int = 0
    kept_soft_pinned: int = 0
    parked_soft_pinned: int = 0
    unparked_soft_pinned: int = 0
    parked_hard_pinned: int = 0
    promoted: int = 0
    demoted_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class ReclaimResult:
    """What one pass did: bytes freed now, bytes whose swap-out started, records looked at.

    Not frozen: a frozen dataclass's `__init__` goes through `object.__setattr__`, and several
    of these are built per direct reclaim, on PutStart's slow path."""

    freed: int = 0
    pending: int = 0
    scanned: int = 0

    def __add__(self, other: ReclaimResult) -> ReclaimResult:
        return ReclaimResult(
            self.freed + other.freed, self.pending + other.pending, self.scanned + other.scanned
        )


@dataclass(slots=True)
class _PassBudget:
    """State of one pass shared by its shards: records it may still look at, and whether a
    swap-out was already refused (then nothing else in this pass is offered one)."""

    scan_left: int
    swap_refused: bool = False
    allow_swap: bool = True


def hash_shard_of(num_shards: int) -> Callable[[object], int]:
    """A stable (never Python's `hash()`) shard function over `repr(key)`, for standalone use."""

    def shard_of(key: object) -> int:
        return xxhash.xxh3_64_intdigest(repr(key).encode()) % num_shards

    return shard_of


class ReclaimEngine(Generic[K]):
    """Per-shard active/inactive lists plus kswapd and direct reclaim over a `ReclaimTarget`."""

    def __init__(
        self,
        target: ReclaimTarget[K],
        config: ReclaimConfig | None = None,
        *,
        num_shards: int = 64,
        shard_of: Callable[[K], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed: int = 0,
        record_index: RecordIndex[K] | None = None,
    ) -> None:
        """`record_index`: where each key's head record is kept, shared by all shards (the
        master keeps it in `ObjectMeta.reclaim`); by default a dict per shard."""
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.target = target
        self.config = config or ReclaimConfig()
        self.clock = clock
        self.stats = ReclaimStats()
        self._usage = ShardUsage(num_shards)
        self._shards: list[ReclaimLists[K]] = [
            ReclaimLists(i, self._usage, record_index) for i in range(num_shards)
        ]
        self._rng = random.Random(seed)
        self._shard_of: Callable[[K], int] = shard_of or hash_shard_of(num_shards)
        self._deficit = [0.0] * num_shards
        self._cursor = 0
        self._migrating: dict[EvictInfo[K], None] = {}
        self._migrating_bytes = 0
        self._kswapd_wanted = False
        self._backoff_until = 0.0
        self._headroom = 0  # bytes that may complete before usage is asked again
        # Bound once: `_above_high` runs on every PutEnd.
        self._memory_usage = target.memory_usage
        self._high_ratio = self.config.high_watermark_ratio
        self.wakeup: Callable[[], object] | None = None
        """Called (from the online path) when kswapd should run now rather than at the next tick."""
        self._local = threading.local()
        # Group commit of direct reclaim: callers add their need to the open group; one leader
        # at a time takes the whole group and runs one pass for it.
        self._gc = threading.Condition(threading.Lock())
        self._gc_open = 0
        self._gc_pending = 0
        self._gc_leader = False
        self._gc_done = -1
        self._gc_freed: dict[int, int] = {}
        self._gc_waiting = 0

    # ------------------------------------------------------------------ views

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    def shard(self, index: int) -> ReclaimLists[K]:
        return self._shards[index]

    def shard_of(self, key: K) -> int:
        return self._shard_of(key)

    def records_of(self, key: K) -> list[EvictInfo[K]]:
        """The current generation's records of `key` (empty when none)."""
        return self._shards[self._shard_of(key)].records_of(key)

    @property
    def resident_bytes(self) -> int:
        return sum(self._usage.bytes)

    @property
    def resident_count(self) -> int:
        return sum(self._usage.count)

    @property
    def migrating_bytes(self) -> int:
        """Bytes of replicas whose swap-out has started and not reported yet."""
        return self._migrating_bytes

    # ------------------------------------------------------------------ online path

    def on_complete(
        self,
        key: K,
        replica_id: Any,
        size: int,
        *,
        generation: int = 0,
        hard_pinned: bool = False,
    ) -> EvictInfo[K]:
        """PutEnd made a memory replica COMPLETE: it enters the head of inactive. Idempotent."""
        rec = EvictInfo(key, replica_id, generation, size)
        rec = self._shards[self._shard_of(key)].add(rec, hard_pinned)
        self._completed(size)
        return rec

    def on_complete_first(self, key: K, replica_id: Any, size: int, shard: int) -> None:
        """`on_complete` (generation 0, not hard pinned) of `key`, which lives in `shard`, in
        the common case of its first record built in one call (`ReclaimLists.add_first`); any
        other case takes the general `add`. The same outcome as `on_complete`."""
        lists = self._shards[shard]
        if lists.add_first(key, replica_id, size) is None:
            lists.add(EvictInfo(key, replica_id, 0, size), False)
        if not self._kswapd_wanted:
            self._headroom -= size
            if self._headroom < 0:
                self._completed(0)

    def on_complete_many(self, done: Sequence[tuple[K, Any, int, bool]]) -> None:
        """`on_complete` of each (key, replica_id, size, hard_pinned), generation 0, in order,
        with the watermark check once for all of them (a batch commit)."""
        shards, shard_of = self._shards, self._shard_of
        total = 0
        for key, replica_id, size, hard_pinned in done:
            lists = shards[shard_of(key)]
            if hard_pinned or lists.add_first(key, replica_id, size) is None:
                lists.add(EvictInfo(key, replica_id, 0, size), hard_pinned)
            total += size
        self._completed(total)

    def _completed(self, size: int) -> None:
        """`size` bytes of replicas completed: wake kswapd when they may have crossed the
        high watermark."""
        if self._kswapd_wanted:
            return
        # Ask the metadata for its usage only once the bytes completed since the last answer
        # could have used up the room below the high watermark (each completion stands for an
        # allocation of its size; frees only add room). Allocations that have not completed
        # yet are missed here, but the tick (and a failed allocation) catch those.
        self._headroom -= size
        if self._headroom < 0:
            cap, used = self._memory_usage()
            self._headroom = int(cap * self._high_ratio) - used
            if cap > 0 and used > cap * self._high_ratio and self._not_backing_off():
                self._kswapd_wanted = True
                if self.wakeup is not None:
                    self.wakeup()

    def on_access(self, key: K) -> None:
        """A read hit: first touch marks referenced, a second one while inactive promotes."""
        shard = self._shards[self._shard_of(key)]
        if shard.mark_accessed(key):
            self.stats.promoted += 1

    def on_replica_removed(self, key: K, replica_id: Any) -> bool:
        """One replica of `key` left (the object stays): retire its record. Idempotent."""
        return self._shards[self._shard_of(key)].remove_replica(key, replica_id)

    def on_remove(self, key: K, generation: int | None = None) -> int:
        """The object (of `generation`, if given) was removed: unlink its records. Idempotent."""
        return len(self._shards[self._shard_of(key)].remove(key, generation))

    def on_soft_pin_end(self, key: K) -> None:
        """`key`'s soft pin expired (or was dropped): records a pass parked as soft pinned go
        back to inactive, among the unpinned ones. O(replicas of the key); idempotent."""
        moved = self._shards[self._shard_of(key)].unpark(key)
        if moved:
            self.stats.unparked_soft_pinned += moved

    # ------------------------------------------------------------------ kswapd

    def kswapd_wanted(self) -> bool:
        """True when kswapd should run: above the high watermark (unless a step found nothing
        to reclaim less than `config.kswapd_backoff` ago), or an allocation failed."""
        return self._kswapd_wanted or (self._above_high() and self._not_backing_off())

    def _not_backing_off(self) -> bool:
        return self._backoff_until <= 0.0 or self.clock() >= self._backoff_until

    def kswapd_step(self) -> ReclaimResult:
        """Reclaim at most `config.kswapd_step_records` average records toward the low watermark.

        Returns an empty result (and stops wanting to run) once used bytes, less those already
        being swapped out, are at or below the low watermark, or when a step made no progress.
        """
        cap, used = self.target.memory_usage()
        excess = used - self._migrating_bytes - math.floor(cap * self.config.low_watermark_ratio)
        if excess <= 0:
            self._kswapd_wanted = False
            return ReclaimResult()
        self.stats.kswapd_steps += 1
        count = sum(self._usage.count)
        avg = sum(self._usage.bytes) // count if count else excess
        step = max(1, self.config.kswapd_step_records * avg)
        result = self._run_pass(min(excess, step), shrink_active=True)
        got = result.freed + result.pending
        if got == 0:
            # Everything left is leased, pinned, busy or has nowhere to go. Do not wake again
            # on every PutEnd above the watermark (each step would scan `scan_limit` records
            # for nothing) until the backoff ends or an allocation fails.
            self._backoff_until = self.clock() + self.config.kswapd_backoff
            log.info("kswapd: nothing reclaimable (%d bytes above the low watermark)", excess)
        else:
            self._backoff_until = 0.0
        if got == 0 or got >= excess:
            # Reached the low watermark: sleep until the high one (hysteresis). Waiting for a
            # step to find nothing to do instead would keep kswapd evicting one object per put.
            self._kswapd_wanted = False
        return result

    def kswapd_pass(self, target_bytes: int | None = None) -> ReclaimResult:
        """Run kswapd to completion: down to the low watermark, or exactly `target_bytes`."""
        if target_bytes is not None:
            return self._run_pass(target_bytes, shrink_active=True)
        total = ReclaimResult()
        while True:
            step = self.kswapd_step()
            if step.freed + step.pending == 0:
                return total
            total = total + step

    # ------------------------------------------------------------------ direct reclaim

    def direct_reclaim(self, bytes_needed: int) -> int:
        """PutStart could not allocate `bytes_needed`: reclaim from inactive lists now.

        Returns the bytes freed by the pass that served this call (shared with the calls it
        grouped). Returns 0 without reclaiming when called from inside a reclaim pass on this
        thread (a swap-out allocating its destination) or inside `no_direct_reclaim()`, so
        reclaim can never recurse into itself. Also wakes kswapd.
        """
        if getattr(self._local, "no_direct", False):
            self.stats.direct_refused += 1
            return 0
        self._kswapd_wanted = True
        if self.wakeup is not None:
            self.wakeup()
        with self._gc:
            self.stats.direct_calls += 1
            self._gc_pending += max(0, bytes_needed)
            group = self._gc_open
            while self._gc_done < group and self._gc_leader:
                self._gc_waiting += 1
                try:
                    self._gc.wait()
                finally:
                    self._gc_waiting -= 1
            if self._gc_done >= group:
                # A leader's pass already covered this caller's group.
                return self._gc_freed.get(group, 0)
            self._gc_leader = True
            total, self._gc_pending = self._gc_pending, 0
            self._gc_open = group + 1
        freed = 0
        try:
            self.stats.direct_passes += 1
            freed = self._run_pass(total, shrink_active=False).freed
        finally:
            with self._gc:
                self._gc_freed[group] = freed
                self._gc_freed.pop(group - _GROUP_RESULTS_KEPT, None)
                self._gc_done = group
                self._gc_leader = False
                self._gc.notify_all()
        return freed

    @contextmanager
    def no_direct_reclaim(self) -> Iterator[None]:
        """Within this block, `direct_reclaim` on this thread returns 0 (paths that would loop:
        batch reads, a swap-out writing to a remote node)."""
        before = getattr(self._local, "no_direct", False)
        self._local.no_direct = True
        try:
            yield
        finally:
            self._local.no_direct = before

    def direct_waiters(self) -> int:
        """Callers currently parked behind a direct-reclaim leader (for tests and status)."""
        with self._gc:
            return self._gc_waiting

    # ------------------------------------------------------------------ swap-out completion

    def on_swap_out_done(self, rec: EvictInfo[K], moved: bool) -> None:
        """A swap-out started by this engine finished: `moved` (source freed) or failed."""
        lists = self._shards[self._shard_of(rec.key)]
        # Tracked here rather than by state: the object may have been removed meanwhile.
        self._untrack_migration(rec)
        if moved:
            lists.end_migration(rec, moved=True)
            self.stats.swap_outs_moved += 1
            self.stats.evicted += 1
            self.stats.evicted_bytes += rec.size
        else:
            lists.end_migration(rec, moved=False)
            self.stats.swap_outs_failed += 1

    def _untrack_migration(self, rec: EvictInfo[K]) -> None:
        if rec in self._migrating:
            del self._migrating[rec]
            self._migrating_bytes -= rec.size

    # ------------------------------------------------------------------ one pass

    def _above_high(self) -> bool:
        cap, used = self._memory_usage()
        return cap > 0 and used > cap * self._high_ratio

    def _run_pass(self, total: int, *, shrink_active: bool) -> ReclaimResult:
        """Reclaim `total` bytes in up to four rounds, each only if the previous fell short:

        1. every shard its quota (kswapd first balances active against inactive);
        2. the shortfall from the shards that met theirs, largest first (inactive only);
        3. age active harder (two looks per record, so referenced ones lose their second
           chance) on the largest shards and try their inactive again: kswapd always, direct
           reclaim only when the alternative is round 4;
        4. cache mode, `allow_evict_soft_pinned`: the soft-pinned records parked (by this
           pass or earlier ones) on the shards' soft-pinned rings, largest ring first.

        Rounds 3 and 4 are global on purpose: one shard whose inactive records are all
        referenced or leased must not scatter its hot set while other shards still have cold
        records, and no soft-pinned object goes while an unpinned one anywhere in the pool could
        have gone instead (a shard's own soft-pinned records are not "last" if another shard
        still has unpinned ones).
        """
        if total <= 0:
            return ReclaimResult()
        before = getattr(self._local, "no_direct", False)
        self._local.no_direct = True
        budget = _PassBudget(
            self.config.scan_limit, allow_swap=shrink_active or self.config.direct_swap_out
        )
        try:
            result = ReclaimResult()
            exhausted: set[int] = set()
            deficit = self._deficit
            for index, share in self._split(total):
                # Records are whole, so shards overshoot; stop at the total and carry the
                # difference between each shard's share and what it gave to the next pass.
                quota = min(share, total - result.freed - result.pending)
                deficit[index] += share - max(quota, 0)
                if quota <= 0 or budget.scan_left <= 0:
                    continue
                lists = self._shards[index]
                if shrink_active:
                    self._balance(lists, quota)
                got = self._shrink_inactive(lists, quota, budget)
                result = result + got
                moved = got.freed + got.pending
                if moved < quota:
                    exhausted.add(index)  # it cannot give more; no debt carried
                else:
                    deficit[index] -= moved - quota
            short = total - result.freed - result.pending
            if short > 0 and budget.scan_left > 0:
                for lists in self._by_usage(exclude=exhausted):
                    got = self._shrink_inactive(lists, short, budget)
                    result = result + got
                    short -= got.freed + got.pending
                    if short <= 0 or budget.scan_left <= 0:
                        break
            soft = short > 0 and self._soft_pinned_parked()
            if short > 0 and (shrink_active or soft) and budget.scan_left > 0:
                for lists in self._by_usage(exclude=set()):
                    if lists.active_bytes <= 0:
                        continue
                    n_active = lists.active_len
                    demoted, _ = lists.shrink_active(short, 2 * n_active, self.config.isolate_batch)
                    self.stats.demoted_bytes += demoted
                    got = self._shrink_inactive(lists, short, budget)
                    result = result + got
                    short -= got.freed + got.pending
                    if short <= 0 or budget.scan_left <= 0:
                        break
            if short > 0 and soft:
                result = result + self._evict_soft_pinned(short, budget)
            return result
        finally:
            self._local.no_direct = before

    def _soft_pinned_parked(self) -> bool:
        """Any record parked soft pinned (cache mode with `allow_evict_soft_pinned` only)."""
        if self.config.mode is not EvictionMode.CACHE or not self.config.allow_evict_soft_pinned:
            return False
        return any(lists.soft_pinned_bytes > 0 for lists in self._shards)

    def _evict_soft_pinned(self, short: int, budget: _PassBudget) -> ReclaimResult:
        """Round 4 of `_run_pass`: evict parked soft-pinned records until `short` bytes are
        freed, from the largest soft-pinned rings first, each from its tail (parked longest).

        It has its own `scan_limit`: the rounds before may have spent theirs on leased records,
        and a request that only soft-pinned objects can serve must still be served."""
        result = ReclaimResult()
        scan_left = self.config.scan_limit
        order = sorted(
            (lists for lists in self._shards if lists.soft_pinned_bytes > 0),
            key=lambda lists: lists.soft_pinned_bytes,
            reverse=True,
        )
        for lists in order:
            got = self._shrink_soft_pinned(lists, short - result.freed, scan_left, budget)
            result = result + got
            scan_left -= got.scanned
            if result.freed >= short or scan_left <= 0:
                break
        return result

    def _shrink_soft_pinned(
        self, lists: ReclaimLists[K], quota: int, scan_limit: int, pass_budget: _PassBudget
    ) -> ReclaimResult:
        """Evict from the tail of `lists`' soft-pinned ring until `quota` bytes are freed,
        looking at no more than `scan_limit` records. A referenced record gets another trip
        round the ring (bit cleared); one whose pin ended since it was parked (before the tick
        that unparks it) is decided like any unpinned record, and kept ones go to inactive."""
        cfg = self.config
        stats = self.stats
        budget = min(lists.soft_pinned_len, scan_limit)
        now = self.clock()
        freed = scanned = 0
        avg = max(1, lists.soft_pinned_bytes // max(1, lists.soft_pinned_len))
        while freed < quota and scanned < budget:
            want = -(-(quota - freed) // avg)
            epoch, batch = lists.isolate_soft_pinned(min(cfg.isolate_batch, budget - scanned, want))
            if not batch:
                break
            stats.isolated += len(batch)
            keep: list[EvictInfo[K]] = []
            unpinned: list[EvictInfo[K]] = []
            pos = 0
            try:
                while pos < len(batch) and freed < quota:
                    rec = batch[pos]
                    pos += 1
                    scanned += 1
                    flags = rec.flags
                    if flags & STATE_MASK != ISOLATED_BITS:
                        continue  # removed while isolated; already retired
                    if flags & REF:
                        lists.clear_referenced(rec)
                        stats.kept_referenced += 1
                        keep.append(rec)
                        continue
                    if self.target.inspect(rec, now) is not Verdict.SOFT_PINNED:
                        # Its pin ended since it was parked (the tick has not said so yet):
                        # an unpinned candidate like any other.
                        stats.unparked_soft_pinned += 1
                        f, _ = self._check_one(
                            lists, rec, epoch, now, keep=unpinned, budget=pass_budget
                        )
                        freed += f
                        continue
                    f, _ = self._evict(lists, rec, epoch, Verdict.SOFT_PINNED, pass_budget)
                    if f:
                        stats.soft_pinned_evicted += 1
                        freed += f
                    elif rec.flags & STATE_MASK == ISOLATED_BITS:
                        keep.append(rec)
            finally:
                # Also on an exception from the target: nothing stays isolated for good.
                lists.putback(unpinned, epoch, ListState.INACTIVE)
                lists.putback(keep, epoch, ListState.SOFT_PINNED)
                lists.putback(batch[pos:], epoch, ListState.SOFT_PINNED, at_tail=True)
        return ReclaimResult(freed, 0, scanned)

    def _by_usage(self, exclude: set[int]) -> list[ReclaimLists[K]]:
        used = self._usage.bytes
        order = sorted(
            (i for i in range(len(used)) if used[i] > 0 and i not in exclude),
            key=used.__getitem__,
            reverse=True,
        )
        return [self._shards[i] for i in order]

    def _split(self, total: int) -> list[tuple[int, int]]:
        """Shard quotas proportional to resident bytes (seed 001: used_i / sum(used)).

        A reclaim of a few records (a direct reclaim for one put) goes to one shard drawn with
        probability used_i / sum(used): proportional on average, and one shard's lock instead
        of all of them. A larger one is split; a shard owed less than one average record (or
        than 1/16 of the pass) keeps its share as a debt (`_deficit`) for a later pass instead
        of being visited for a sliver, and whatever nobody took goes to the shard owed most.
        """
        used = self._usage.bytes
        total_used = sum(used)
        if total_used <= 0:
            return []
        n = len(used)
        avg = total_used / max(1, sum(self._usage.count))
        if total <= _SMALL_RECLAIM_RECORDS * avg:
            (index,) = self._rng.choices(range(n), weights=used)
            return [(index, total)]
        # Visiting a shard has a fixed cost, so a pass visits only shards owed at least a
        # 1/_MAX_SHARDS_PER_PASS of it; the others' shares wait in their debt.
        grain = max(avg, total / _MAX_SHARDS_PER_PASS)
        quotas: list[tuple[int, int]] = []
        assigned = 0
        deficit = self._deficit
        best = -1
        for j in range(n):
            i = (self._cursor + j) % n
            if used[i] <= 0:
                deficit[i] = 0.0
                continue
            d = deficit[i] + total * used[i] / total_used
            if d >= grain and assigned < total:
                q = min(math.ceil(d), total - assigned)
                quotas.append((i, q))
                assigned += q
                d -= q
            deficit[i] = d
            if best < 0 or d > deficit[best]:
                best = i
        if assigned < total and best >= 0:
            q = total - assigned
            quotas.append((best, q))
            deficit[best] -= q
        self._cursor = (self._cursor + 1) % n
        return quotas

    def _balance(self, lists: ReclaimLists[K], quota: int) -> None:
        """kswapd only: demote from active so that active <= inactive_ratio * inactive, and so
        that inactive holds at least this pass's quota."""
        ratio = self.config.inactive_ratio
        excess = (lists.active_bytes - ratio * lists.inactive_bytes) / (1.0 + ratio)
        want = max(excess, float(quota - lists.inactive_bytes))
        if want <= 0 or lists.active_bytes <= 0:
            return
        n_active = lists.active_len
        demoted, _ = lists.shrink_active(math.ceil(want), n_active, self.config.isolate_batch)
        self.stats.demoted_bytes += demoted

    def _shrink_inactive(
        self, lists: ReclaimLists[K], quota: int, pass_budget: _PassBudget
    ) -> ReclaimResult:
        """Evict from the tail of `lists`' inactive list until `quota` bytes are freed or
        moving, looking at each record present at the start at most once, and at no more
        records than the pass has left. Soft-pinned records (cache mode, evictable last) are
        parked on the soft-pinned ring for round 4, not evicted here."""
        cfg = self.config
        budget = min(lists.inactive_len, pass_budget.scan_left)
        now = self.clock()
        freed = pending = scanned = 0
        avg = max(1, lists.resident_bytes // max(1, lists.resident_count))
        try:
            while freed + pending < quota and scanned < budget:
                # Isolate about as many as the rest of the quota needs (at least one, at most
                # a batch): a 4 KiB direct reclaim should not isolate and put back bystanders.
                want = -(-(quota - freed - pending) // avg)
                n = min(cfg.isolate_batch, budget - scanned, max(1, want))
                epoch, batch = lists.isolate_inactive(n)
                if not batch:
                    break
                self.stats.isolated += len(batch)
                keep: list[EvictInfo[K]] = []
                pos = 0
                try:
                    while pos < len(batch) and freed + pending < quota:
                        rec = batch[pos]
                        scanned += 1
                        f, p = self._check_one(
                            lists, rec, epoch, now, keep=keep, budget=pass_budget
                        )
                        pos += 1
                        freed += f
                        pending += p
                finally:
                    # Also on an exception from the target: nothing stays isolated for good.
                    lists.putback(keep, epoch, ListState.INACTIVE)
                    lists.putback(batch[pos:], epoch, ListState.INACTIVE, at_tail=True)
        finally:
            pass_budget.scan_left -= scanned
        return ReclaimResult(freed, pending, scanned)

    def _check_one(
        self,
        lists: ReclaimLists[K],
        rec: EvictInfo[K],
        epoch: int,
        now: float,
        *,
        keep: list[EvictInfo[K]],
        budget: _PassBudget,
    ) -> tuple[int, int]:
        """Decide about one isolated record, outside the list lock; (freed, pending) bytes."""
        stats = self.stats
        flags = rec.flags  # (state and bit read at once, without the properties' cost)
        if flags & STATE_MASK != ISOLATED_BITS:
            return 0, 0  # removed while isolated; already retired
        if flags & REF:
            # Touched once since it came to inactive: one more trip through inactive (bit
            # cleared) to earn the second touch that promotes it. Linux keeps a
            # once-referenced mapped folio the same way (FOLIOREF_KEEP).
            lists.clear_referenced(rec)
            stats.kept_referenced += 1
            keep.append(rec)
            return 0, 0
        verdict = self.target.inspect(rec, now)
        if verdict is _STALE:
            stats.stale += 1
            lists.forget(rec)
        elif verdict is _HARD_PINNED:
            stats.parked_hard_pinned += 1
            lists.park_unevictable(rec, epoch)
        elif verdict is _LEASED:
            stats.kept_leased += 1
            keep.append(rec)
        elif verdict is _BUSY:
            stats.kept_busy += 1
            keep.append(rec)
        elif verdict is _SOFT_PINNED and self.config.mode is _CACHE:
            if self.config.allow_evict_soft_pinned:
                # Off inactive until its pin ends: only round 4 of a pass looks at it again.
                stats.parked_soft_pinned += 1
                lists.park_soft_pinned(rec, epoch)
            else:
                stats.kept_soft_pinned += 1
                keep.append(rec)
        else:
            f, p = self._evict(lists, rec, epoch, verdict, budget)
            if f == 0 and p == 0 and rec.flags & STATE_MASK == ISOLATED_BITS:
                keep.append(rec)
            return f, p
        return 0, 0

    def _evict(
        self,
        lists: ReclaimLists[K],
        rec: EvictInfo[K],
        epoch: int,
        verdict: Verdict,
        budget: _PassBudget,
    ) -> tuple[int, int]:
        """Carry out the eviction of one isolated record; returns (freed, pending) bytes."""
        stats = self.stats
        if self.config.mode is _CACHE or verdict is _DROPPABLE:
            freed = self.target.drop(rec)
            if freed:
                lists.forget(rec)  # (already retired if the drop removed the object)
                stats.dropped += 1
                stats.evicted += 1
                stats.evicted_bytes += freed
            # Nothing freed: the record stays isolated and goes back on the list; if it was
            # stale after all, the next pass's inspect says so and drops it.
            return freed, 0
        # Pool mode, a primary or soft-pinned replica: move it out before freeing anything.
        if not budget.allow_swap:
            stats.swap_outs_refused += 1
            return 0, 0  # a direct reclaim that may not wait for a move: kept
        if budget.swap_refused:
            stats.swap_outs_refused += 1
            return 0, 0  # nothing could take the last one; kept without asking again
        if not lists.start_migration(rec, epoch):
            return 0, 0
        self._migrating[rec] = None
        self._migrating_bytes += rec.size
        if self.target.swap_out(rec):
            stats.swap_outs_started += 1
            return 0, rec.size
        stats.swap_outs_refused += 1
        budget.swap_refused = True
        self._untrack_migration(rec)
        lists.end_migration(rec, moved=False)
        return 0, 0
