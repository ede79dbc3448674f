"""Direct reclaim of one contiguous range: evict neighbours so that a put's block fits.

Byte-counting direct reclaim (`ReclaimEngine.direct_reclaim`) frees as many bytes as a put
asked for, from the tails of the inactive lists; those bytes lie wherever the evicted replicas
were, so in a fragmented segment a put of a few MiB can still find no free block large enough
although the pool has room (issue #13). `RangeReclaimer.reclaim_range(size)` frees one range
instead, as Linux's lumpy reclaim freed the neighbours of a victim page to make a high-order
block:

1. isolate a window of the oldest inactive records (at most `ReclaimConfig.range_scan_limit`,
   spread over the shards by their inactive lengths) and ask the target about each, outside
   the list locks;
2. place the evictable ones (cache mode: PRIMARY or DROPPABLE; pool mode: DROPPABLE only, since
   a put cannot wait for a move) on their segments (`RangeLayout.place`). With the free blocks
   around them (`FreeMap`) they form runs of contiguous free-or-evictable bytes; anything else
   ends a run (a replica being written, a leased, busy or pinned object, an arena, a parked
   range, a record outside the window, a referenced record: it keeps its second chance);
3. in every run at least `size` long, the stretch of consecutive pieces that covers `size`
   with the fewest evicted bytes (two pointers, O(pieces)) is a candidate; the cheapest one
   over all runs is evicted, and nothing else;
4. every other record goes back to the tail of its inactive list in its old order, or is
   settled as a normal pass settles it: stale dropped, hard-pinned parked unevictable,
   soft-pinned parked on its ring (cache mode, `allow_evict_soft_pinned`: evicted last, by the
   byte pass's round 4, never here).

When no run is long enough it evicts nothing and answers 0; the caller then runs a byte pass
(which also ages the lists) and may try again. Work per call is bounded by the window: one
isolation and one `inspect` per record, a sort per segment, no walk of the metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Generic, Protocol

from kvpool.master.reclaim.base import Verdict
from kvpool.master.reclaim.config import EvictionMode
from kvpool.master.reclaim.engine import ReclaimEngine
from kvpool.master.reclaim.lists import ReclaimLists
from kvpool.master.reclaim.records import ISOLATED_BITS, REF, STATE_MASK, EvictInfo, K, ListState

__all__ = ["FreeMap", "RangeLayout", "RangeReclaimer", "RangeStats"]


class FreeMap(Protocol):
    """The free blocks of one segment, as far as a range reclaim needs them
    (`kvpool.master.allocator.OffsetAllocator` is one)."""

    def free_ending_at(self, offset: int) -> int:
        """Bytes of the free block ending exactly at `offset`; 0 when none."""
        ...

    def free_starting_at(self, offset: int) -> int:
        """Bytes of the free block starting exactly at `offset`; 0 when none."""
        ...


class RangeLayout(Protocol[K]):
    """Where records lie: what the engine (generic over keys) does not know."""

    def place(self, rec: EvictInfo[K]) -> tuple[FreeMap, int] | None:
        """The free map of `rec`'s segment and the offset of its range (`rec.size` bytes, the
        aligned allocation); None when the replica has no place any more (segment gone)."""
        ...


@dataclass(slots=True)
class RangeStats:
    """Counters of range reclaim since start (for the master's reclaim stats)."""

    range_calls: int = 0
    range_found: int = 0
    range_missed: int = 0
    range_evicted: int = 0
    range_evicted_bytes: int = 0
    range_scanned: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# A window covers the range this many times over in average records (the evictable ones
# must also lie next to each other), and holds at least this many records.
_WINDOW_COVER = 32
_WINDOW_MIN = 256

# One piece of a run: (length, evicted bytes, the record to evict or None for a free block).
_Piece = tuple[int, int, "EvictInfo[K] | None"]


class RangeReclaimer(Generic[K]):
    """`reclaim_range` over a `ReclaimEngine`'s lists (see the module docstring)."""

    def __init__(self, engine: ReclaimEngine[K], layout: RangeLayout[K]) -> None:
        self.engine = engine
        self.layout = layout
        self.stats = RangeStats()

    def reclaim_range(self, size: int) -> int:
        """Evict the cheapest set of evictable inactive replicas that, with the free blocks
        between them, make one free range of at least `size` bytes on one segment; answer the
        bytes freed (0: no such set in the window, nothing evicted)."""
        if size <= 0:
            return 0
        engine = self.engine
        self.stats.range_calls += 1
        isolated = self._isolate(self._window(size))
        now = engine.clock()
        freed = 0
        try:
            by_map: dict[int, tuple[FreeMap, list[tuple[int, EvictInfo[K]]]]] = {}
            for lists, epoch, batch in isolated:
                self.stats.range_scanned += len(batch)
                for rec in batch:
                    verdict = self._judge(lists, rec, epoch, now)
                    if verdict is None:
                        continue
                    where = self.layout.place(rec)
                    if where is None:
                        continue
                    free_map, offset = where
                    entry = by_map.get(id(free_map))
                    if entry is None:
                        by_map[id(free_map)] = (free_map, [(offset, rec)])
                    else:
                        entry[1].append((offset, rec))
            best: list[EvictInfo[K]] | None = None
            best_cost = math.inf
            for free_map, placed in by_map.values():
                for run in _runs(free_map, placed):
                    found = _cheapest(run, size)
                    if found is not None and found[0] < best_cost:
                        best_cost, best = found
            if best is None:
                self.stats.range_missed += 1
                return 0
            self.stats.range_found += 1
            freed = self._evict(best, isolated)
            return freed
        finally:
            for lists, epoch, batch in isolated:
                # Not evicted: back to the tail in the old order (not looked at, as far as the
                # lists' ageing goes); records settled above are skipped by `putback`.
                lists.putback(batch, epoch, ListState.INACTIVE, at_tail=True)

    # ------------------------------------------------------------------ steps

    def _window(self, size: int) -> int:
        """Records to look at for a range of `size` bytes: enough average records to cover it
        several times over (`_WINDOW_COVER`), at least `_WINDOW_MIN`, at most the config's
        `range_scan_limit`."""
        engine = self.engine
        count = engine.resident_count
        avg = engine.resident_bytes // count if count else size
        want = _WINDOW_COVER * -(-size // max(1, avg))
        return max(1, min(engine.config.range_scan_limit, max(_WINDOW_MIN, want)))

    def _isolate(self, limit: int) -> list[tuple[ReclaimLists[K], int, list[EvictInfo[K]]]]:
        engine = self.engine
        shards = [engine.shard(i) for i in range(engine.num_shards)]
        total = sum(lists.inactive_len for lists in shards)
        out: list[tuple[ReclaimLists[K], int, list[EvictInfo[K]]]] = []
        if total <= 0:
            return out
        left = limit
        for lists in sorted(shards, key=lambda x: x.inactive_len, reverse=True):
            n = lists.inactive_len
            if n <= 0 or left <= 0:
                break
            want = min(left, max(1, math.ceil(limit * n / total)))
            epoch, batch = lists.isolate_inactive(want)
            if batch:
                engine.stats.isolated += len(batch)
                out.append((lists, epoch, batch))
                left -= len(batch)
        return out

    def _judge(
        self, lists: ReclaimLists[K], rec: EvictInfo[K], epoch: int, now: float
    ) -> Verdict | None:
        """The verdict of an evictable record, else None (after settling it as a pass would:
        stale ones dropped, pinned ones parked; the rest stays isolated for the putback)."""
        engine = self.engine
        stats = engine.stats
        flags = rec.flags
        if flags & STATE_MASK != ISOLATED_BITS or flags & REF:
            return None  # removed meanwhile, or referenced: its second chance is the byte pass's
        verdict = engine.target.inspect(rec, now)
        if verdict is Verdict.STALE:
            stats.stale += 1
            lists.forget(rec)
        elif verdict is Verdict.HARD_PINNED:
            stats.parked_hard_pinned += 1
            lists.park_unevictable(rec, epoch)
        elif verdict is Verdict.SOFT_PINNED:
            cfg = engine.config
            if cfg.mode is EvictionMode.CACHE and cfg.allow_evict_soft_pinned:
                stats.parked_soft_pinned += 1
                lists.park_soft_pinned(rec, epoch)
        elif verdict is Verdict.DROPPABLE or (
            verdict is Verdict.PRIMARY and engine.config.mode is EvictionMode.CACHE
        ):
            return verdict
        return None  # leased, busy, or a primary pool mode would have to move

    def _evict(
        self,
        chosen: list[EvictInfo[K]],
        isolated: list[tuple[ReclaimLists[K], int, list[EvictInfo[K]]]],
    ) -> int:
        engine = self.engine
        lists_of = {id(rec): lists for lists, _, batch in isolated for rec in batch}
        freed = 0
        for rec in chosen:
            if rec.flags & STATE_MASK != ISOLATED_BITS:
                continue  # went with an object evicted just before (its other replica)
            got = engine.target.drop(rec)
            if got:
                lists_of[id(rec)].forget(rec)
                freed += got
                engine.stats.dropped += 1
                engine.stats.evicted += 1
                engine.stats.evicted_bytes += got
                self.stats.range_evicted += 1
                self.stats.range_evicted_bytes += got
        return freed


def _runs(free_map: FreeMap, placed: list[tuple[int, EvictInfo[K]]]) -> list[list[_Piece[K]]]:
    """The runs of contiguous free-or-evictable pieces that `placed` (offset, record) make on
    one segment, each with the free blocks at its ends."""
    placed.sort(key=lambda item: item[0])
    runs: list[list[_Piece[K]]] = []
    run: list[_Piece[K]] = []
    end = -1
    for offset, rec in placed:
        size = rec.size
        if run:
            if offset == end:
                run.append((size, size, rec))
                end += size
                continue
            gap = free_map.free_starting_at(end)
            if gap and end + gap == offset:
                run.append((gap, 0, None))
                run.append((size, size, rec))
                end = offset + size
                continue
            if gap:
                run.append((gap, 0, None))
            runs.append(run)
        left = free_map.free_ending_at(offset)
        run = [(left, 0, None)] if left else []
        run.append((size, size, rec))
        end = offset + size
    if run:
        gap = free_map.free_starting_at(end)
        if gap:
            run.append((gap, 0, None))
        runs.append(run)
    return runs


def _cheapest(run: list[_Piece[K]], size: int) -> tuple[int, list[EvictInfo[K]]] | None:
    """The consecutive pieces of `run` at least `size` long with the fewest evicted bytes:
    (their evicted bytes, their records), or None when the run is too short."""
    if sum(piece[0] for piece in run) < size:
        return None
    best: tuple[int, int, int] | None = None  # cost, first, last (inclusive)
    length = cost = 0
    first = 0
    for last, (n, c, _) in enumerate(run):
        length += n
        cost += c
        while length - run[first][0] >= size:
            length -= run[first][0]
            cost -= run[first][1]
            first += 1
        if length >= size and (best is None or cost < best[0]):
            best = (cost, first, last)
    if best is None:
        return None
    cost, first, last = best
    return cost, [rec for _, _, rec in run[first : last + 1] if rec is not None]
