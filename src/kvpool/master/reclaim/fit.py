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
4. cache mode with `allow_evict_soft_pinned`: only when no run of unpinned candidates is long
   enough, steps 2-3 again with the soft-pinned records of the window and of the shards'
   soft-pinned rings (what is left of the window's budget), a soft-pinned byte costing more
   than any number of unpinned ones: soft-pinned go last, pool-wide, as in a byte pass;
5. every other record goes back to the tail of its list in its old order, or is settled as a
   normal pass settles it: stale dropped, hard-pinned parked unevictable, soft-pinned parked
   on its shard's soft-pinned ring.

When no run is long enough it evicts nothing and answers 0, and the put fails (having freed
what the byte pass before it freed). Work per call is bounded by the window: one isolation and
one `inspect` per record, a sort per segment, no walk of the metadata. The master's adapter
(`adapter.py`) provides the layout; `src/kvpool/master/reclaim/README.md` ("Range reclaim")
says what a window cannot do.
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
# A soft-pinned byte costs more than all the unpinned bytes any segment could hold (256 TiB).
_SOFT_WEIGHT = 1 << 48

# One piece of a run: (length, evicted bytes, the record to evict or None for a free block).
_Piece = tuple[int, int, "EvictInfo[K] | None"]


@dataclass(slots=True)
class _Batch(Generic[K]):
    """Records one range reclaim isolated from one ring of one shard."""

    lists: ReclaimLists[K]
    epoch: int
    records: list[EvictInfo[K]]
    soft: bool  # from the soft-pinned ring (else from inactive)


@dataclass(slots=True)
class _Window(Generic[K]):
    """What a range reclaim found in its window: evictable records placed on their segments,
    unpinned ones and (cache mode) soft-pinned ones apart."""

    placed: dict[int, tuple[FreeMap, list[tuple[int, EvictInfo[K], bool]]]]
    soft: list[tuple[_Batch[K], EvictInfo[K]]] | None = None


class RangeReclaimer(Generic[K]):
    """`reclaim_range` over a `ReclaimEngine`'s lists (see the module docstring)."""

    def __init__(self, engine: ReclaimEngine[K], layout: RangeLayout[K]) -> None:
        self.engine = engine
        self.layout = layout
        self.stats = RangeStats()

    def reclaim_range(self, size: int) -> int:
        """Evict the cheapest set of evictable inactive replicas that, with the free blocks
        between them, make one free range of at least `size` bytes on one segment; answer the
        bytes freed (0: no such set in the window, nothing evicted).

        Soft-pinned replicas (cache mode, `allow_evict_soft_pinned`) are evicted last, as by a
        byte pass: only when no range can be made of unpinned ones, and then the range with
        the fewest soft-pinned bytes."""
        if size <= 0:
            return 0
        engine = self.engine
        cfg = engine.config
        self.stats.range_calls += 1
        limit = self._window(size)
        batches = self._isolate(limit, soft=False)
        window: _Window[K] = _Window({})
        try:
            self._judge_all(batches, window, engine.clock())
            best = _best(window.placed, size, soft=False)
            soft_last = cfg.mode is EvictionMode.CACHE and cfg.allow_evict_soft_pinned
            if best is None and soft_last:
                # Soft-pinned go last: also those parked on the soft-pinned rings earlier.
                left = max(0, limit - sum(len(b.records) for b in batches))
                more = self._isolate(left, soft=True) if left else []
                batches += more
                self._judge_all(more, window, engine.clock())
                best = _best(window.placed, size, soft=True)
            if best is None:
                self.stats.range_missed += 1
                return 0
            self.stats.range_found += 1
            soft_ids = {id(rec) for _, rec in window.soft or ()}
            return self._evict(best, batches, soft_ids)
        finally:
            for rec_batch, rec in window.soft or ():
                if rec.flags & STATE_MASK == ISOLATED_BITS and not rec_batch.soft:
                    engine.stats.parked_soft_pinned += 1
                    rec_batch.lists.park_soft_pinned(rec, rec_batch.epoch)
            for b in batches:
                # Not evicted: back to the tail of the ring it came from, in the old order
                # (not looked at, as far as ageing goes); records settled are skipped.
                where = ListState.SOFT_PINNED if b.soft else ListState.INACTIVE
                b.lists.putback(b.records, b.epoch, where, at_tail=True)

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

    def _isolate(self, limit: int, *, soft: bool) -> list[_Batch[K]]:
        """Up to `limit` records off the tails of every shard's inactive (or soft-pinned)
        ring, in proportion to the rings' lengths."""
        engine = self.engine
        shards = [engine.shard(i) for i in range(engine.num_shards)]

        def length(lists: ReclaimLists[K]) -> int:
            return lists.soft_pinned_len if soft else lists.inactive_len

        total = sum(length(lists) for lists in shards)
        out: list[_Batch[K]] = []
        if total <= 0:
            return out
        left = limit
        for lists in sorted(shards, key=length, reverse=True):
            n = length(lists)
            if n <= 0 or left <= 0:
                break
            want = min(left, max(1, math.ceil(limit * n / total)))
            if soft:
                epoch, records = lists.isolate_soft_pinned(want)
            else:
                epoch, records = lists.isolate_inactive(want)
            if records:
                engine.stats.isolated += len(records)
                self.stats.range_scanned += len(records)
                out.append(_Batch(lists, epoch, records, soft))
                left -= len(records)
        return out

    def _judge_all(self, batches: list[_Batch[K]], window: _Window[K], now: float) -> None:
        """Ask about every record of `batches` and place the evictable ones in `window`."""
        for b in batches:
            for rec in b.records:
                verdict = self._judge(b, rec, now)
                if verdict is None:
                    continue
                soft = verdict is Verdict.SOFT_PINNED
                if soft:
                    if window.soft is None:
                        window.soft = []
                    window.soft.append((b, rec))
                where = self.layout.place(rec)
                if where is None:
                    continue
                free_map, offset = where
                entry = window.placed.get(id(free_map))
                if entry is None:
                    window.placed[id(free_map)] = (free_map, [(offset, rec, soft)])
                else:
                    entry[1].append((offset, rec, soft))

    def _judge(self, b: _Batch[K], rec: EvictInfo[K], now: float) -> Verdict | None:
        """The verdict of a record a range may take (PRIMARY or DROPPABLE, or SOFT_PINNED for
        the last stage), else None, after settling it as a pass would (stale ones dropped,
        hard-pinned ones parked; the rest stays isolated for the putback)."""
        engine = self.engine
        stats = engine.stats
        lists, epoch = b.lists, b.epoch
        flags = rec.flags
        if flags & STATE_MASK != ISOLATED_BITS or flags & REF:
            return None  # removed meanwhile, or referenced: its second chance is the byte pass's
        verdict = engine.target.inspect(rec, now)
        cache = engine.config.mode is EvictionMode.CACHE
        if verdict is Verdict.STALE:
            stats.stale += 1
            lists.forget(rec)
        elif verdict is Verdict.HARD_PINNED:
            stats.parked_hard_pinned += 1
            lists.park_unevictable(rec, epoch)
        elif verdict is Verdict.SOFT_PINNED:
            if cache and engine.config.allow_evict_soft_pinned:
                return verdict
        elif verdict is Verdict.DROPPABLE or (verdict is Verdict.PRIMARY and cache):
            if b.soft:
                # Its pin ended before the tick said so: an unpinned record, back to inactive
                # unless the range takes it.
                stats.unparked_soft_pinned += 1
                lists.putback([rec], epoch, ListState.INACTIVE)
                return None
            return verdict
        return None  # leased, busy, or a primary pool mode would have to move

    def _evict(
        self, chosen: list[EvictInfo[K]], batches: list[_Batch[K]], soft_ids: set[int]
    ) -> int:
        engine = self.engine
        lists_of = {id(rec): b.lists for b in batches for rec in b.records}
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
                if id(rec) in soft_ids:
                    engine.stats.soft_pinned_evicted += 1
                self.stats.range_evicted += 1
                self.stats.range_evicted_bytes += got
        return freed


def _best(
    placed: dict[int, tuple[FreeMap, list[tuple[int, EvictInfo[K], bool]]]],
    size: int,
    *,
    soft: bool,
) -> list[EvictInfo[K]] | None:
    """The records of the cheapest range of `size` bytes over every segment of `placed`:
    unpinned records only, or (`soft`) soft-pinned ones too, the fewest soft-pinned bytes
    first."""
    best: list[EvictInfo[K]] | None = None
    best_cost = math.inf
    for free_map, items in placed.values():
        usable = [(o, r, p) for o, r, p in items if soft or not p]
        for run in _runs(free_map, usable):
            found = _cheapest(run, size)
            if found is not None and found[0] < best_cost:
                best_cost, best = found
    return best


def _runs(free_map: FreeMap, placed: list[tuple[int, EvictInfo[K], bool]]) -> list[list[_Piece[K]]]:
    """The runs of contiguous free-or-evictable pieces that `placed` (offset, record, soft
    pinned) make on one segment, each with the free blocks at its ends. A piece's cost is its
    bytes, times `_SOFT_WEIGHT` for a soft-pinned one."""
    placed.sort(key=lambda item: item[0])
    runs: list[list[_Piece[K]]] = []
    run: list[_Piece[K]] = []
    end = -1
    for offset, rec, soft in placed:
        size = rec.size
        piece = (size, size * _SOFT_WEIGHT if soft else size, rec)
        if run:
            if offset == end:
                run.append(piece)
                end += size
                continue
            gap = free_map.free_starting_at(end)
            if gap and end + gap == offset:
                run.append((gap, 0, None))
                run.append(piece)
                end = offset + size
                continue
            if gap:
                run.append((gap, 0, None))
            runs.append(run)
        left = free_map.free_ending_at(offset)
        run = [(left, 0, None)] if left else []
        run.append(piece)
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
