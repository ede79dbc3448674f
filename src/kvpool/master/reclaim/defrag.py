"""Pool-mode defragmentation: move the neighbours out of one range so that a put fits.

In pool mode an object's last (primary) replica is never dropped, only moved, so range
reclaim (`fit.py`) cannot free a range out of one-replica objects: a fragmented segment below
the high watermark refused about 9 % of mixed-size puts (issue #13) although it had the bytes.
A put cannot wait for a move (moves are MOVE replica tasks that nodes execute), so
`Defragmenter.defragment(size)` starts the moves and answers a retry hint instead:

1. the window and the candidates are range reclaim's (`RangeReclaimer`: the oldest inactive
   records, placed on their segments with the free blocks around them); a candidate is any
   replica that may *move* (`RangeMover.movable`: complete, not leased, not hard-pinned, no
   task, not being written, not referenced), whatever its segment's pressure;
2. the cheapest stretch of at least `size` bytes (fewest bytes to move) is chosen, if it needs
   at most `defrag_max_moves` moves and the moves in flight stay within
   `defrag_max_in_flight`;
3. each of its records gets a MOVE task (`RangeMover.move_away`) to another segment with room
   (at or below the low watermark with it), else to its own segment outside the stretch's free
   blocks, so no move lands in the range being made; its record is MIGRATING meanwhile, as in
   a swap-out, and the source is freed when the node reports the move done;
4. the put is answered NO_AVAILABLE_HANDLE with `retry_after_ms` (`defrag_retry_ms`); a put
   that fails while a stretch of at least its size is being made joins it (same hint, no new
   moves), so a retried put does not start a second window.

Nothing is dropped and nothing is reserved: once the moves are done the range is free for
whichever put comes first. Work per call is range reclaim's window; moves in flight and
windows under way are bounded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Protocol

from kvpool.master.reclaim.base import Verdict
from kvpool.master.reclaim.engine import ReclaimEngine
from kvpool.master.reclaim.fit import RangeLayout, RangeReclaimer, _Batch, _best, _Window
from kvpool.master.reclaim.lists import ReclaimLists
from kvpool.master.reclaim.records import ISOLATED_BITS, REF, STATE_MASK, EvictInfo, K, ListState

__all__ = ["DefragStats", "Defragmenter", "RangeMover"]

_MAX_WINDOWS = 16
"""Stretches being made at once, at most (each holds a list entry until its moves end)."""
_ATTEMPTS = 4
"""Ranges one call tries, the cheapest first, when the moves of one cannot all start."""


class RangeMover(Protocol[K]):
    """What a defragmentation asks of the metadata owner (the master's adapter)."""

    def movable(self, rec: EvictInfo[K], now: float) -> Verdict:
        """`inspect`, without pool mode's pressure rule: PRIMARY, DROPPABLE or SOFT_PINNED
        when the replica may move now; STALE and HARD_PINNED as `inspect`; else BUSY or
        LEASED."""
        ...

    def room(self) -> int:
        """Bytes of the largest free block a move could take (a larger record cannot move)."""
        ...

    def move_away(
        self,
        moves: Sequence[tuple[EvictInfo[K], Callable[[bool], None]]],
        keep_free: Sequence[tuple[int, int]],
    ) -> bool:
        """Start moving the replica of each `(rec, on_done)` of `moves` out of its place
        (anywhere but the free ranges `keep_free` of its segment), all or none; False, with
        nothing changed, when one cannot move. Each `on_done(moved)` once, later, when its
        move ends."""
        ...


@dataclass(slots=True)
class DefragStats:
    """Counters of pool-mode defragmentation since start (the master's reclaim stats)."""

    defrag_calls: int = 0
    defrag_windows: int = 0
    defrag_joined: int = 0
    defrag_missed: int = 0
    defrag_moves: int = 0
    defrag_moved: int = 0
    defrag_move_failed: int = 0
    defrag_moved_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True, eq=False)
class _Pending:
    """A stretch being made: its size (0 once a move could not start: no put joins it) and
    the moves still running."""

    size: int
    left: int = 0


class Defragmenter(RangeReclaimer[K]):
    """`defragment` over a `ReclaimEngine`'s lists (see the module docstring)."""

    def __init__(
        self, engine: ReclaimEngine[K], layout: RangeLayout[K], mover: RangeMover[K]
    ) -> None:
        super().__init__(engine, layout)
        self.mover = mover
        self.defrag = DefragStats()
        self._pending: list[_Pending] = []
        self._in_flight = 0
        self._room = 0  # the mover's room, for the call under way

    @property
    def in_flight(self) -> int:
        """Moves started by defragmentation and not ended yet."""
        return self._in_flight

    def defragment(self, size: int) -> int:
        """Start the moves that make one free range of at least `size` bytes, or join a
        stretch of that size being made; answer the milliseconds after which a put may ask
        again (0: nothing under way for it)."""
        cfg = self.engine.config
        stats = self.defrag
        stats.defrag_calls += 1
        if size <= 0:
            return 0
        hint = cfg.defrag_retry_ms
        if any(p.size >= size for p in self._pending):
            stats.defrag_joined += 1
            return hint
        if len(self._pending) >= _MAX_WINDOWS or self._in_flight >= cfg.defrag_max_in_flight:
            stats.defrag_missed += 1
            return hint  # moves under way end soon; then there is budget again
        self._room = self.mover.room()
        batches = self._isolate(self._window(size), soft=False)
        window: _Window[K] = _Window({})
        try:
            self._judge_all(batches, window, self.engine.clock())
            for _ in range(_ATTEMPTS):
                best = _best(window.placed, size, soft=False)
                if (
                    best is None
                    or len(best) > cfg.defrag_max_moves
                    or self._in_flight + len(best) > cfg.defrag_max_in_flight
                ):
                    break
                if self._start(best, batches, size):
                    return hint
                # One of them found no place (moves compete for the same free blocks): the
                # next cheapest range without the largest of them.
                _leave_out(window, max(best, key=lambda rec: rec.size))
            stats.defrag_missed += 1
            return 0
        finally:
            for b in batches:
                b.lists.putback(b.records, b.epoch, ListState.INACTIVE, at_tail=True)

    def _judge(self, b: _Batch[K], rec: EvictInfo[K], now: float) -> Verdict | None:
        """PRIMARY for a record that may move (placed as an unpinned candidate), else None
        after settling it as a pass would (stale dropped, hard-pinned parked)."""
        flags = rec.flags
        if flags & STATE_MASK != ISOLATED_BITS or flags & REF:
            return None
        verdict = self.mover.movable(rec, now)
        if verdict is Verdict.STALE:
            self.engine.stats.stale += 1
            b.lists.forget(rec)
        elif verdict is Verdict.HARD_PINNED:
            self.engine.stats.parked_hard_pinned += 1
            b.lists.park_unevictable(rec, b.epoch)
        elif verdict in _MOVABLE and rec.size <= self._room:
            return Verdict.PRIMARY
        return None

    def _start(self, chosen: list[EvictInfo[K]], batches: list[_Batch[K]], size: int) -> bool:
        """A MOVE for every record of `chosen`, all or none."""
        batch_of = {id(rec): b for b in batches for rec in b.records}
        if any(rec.flags & STATE_MASK != ISOLATED_BITS for rec in chosen):
            return False
        pending = _Pending(size)
        moves = [
            (rec, functools.partial(self._done, rec, pending, batch_of[id(rec)].lists))
            for rec in chosen
        ]
        if not self.mover.move_away(moves, self._free_around(chosen)):
            return False
        for rec in chosen:
            b = batch_of[id(rec)]
            b.lists.start_migration(rec, b.epoch)  # isolated under this epoch: checked above
        pending.left = len(chosen)
        self._in_flight += len(chosen)
        self._pending.append(pending)
        self.defrag.defrag_windows += 1
        self.defrag.defrag_moves += len(chosen)
        return True

    def _free_around(self, chosen: list[EvictInfo[K]]) -> list[tuple[int, int]]:
        """The free blocks next to the records of `chosen` (all on one segment): with their
        ranges, the stretch being made."""
        out: dict[int, int] = {}
        for rec in chosen:
            where = self.layout.place(rec)
            if where is None:
                continue
            free_map, off = where
            left = free_map.free_ending_at(off)
            if left:
                out[off - left] = left
            right = free_map.free_starting_at(off + rec.size)
            if right:
                out[off + rec.size] = right
        return sorted(out.items())

    def _done(
        self, rec: EvictInfo[K], pending: _Pending, lists: ReclaimLists[K], moved: bool
    ) -> None:
        lists.end_migration(rec, moved)
        self._in_flight -= 1
        pending.left -= 1
        if moved:
            self.defrag.defrag_moved += 1
            self.defrag.defrag_moved_bytes += rec.size
        else:
            self.defrag.defrag_move_failed += 1
            pending.size = 0
        if pending.left <= 0 and pending in self._pending:
            self._pending.remove(pending)


def _leave_out(window: _Window[K], rec: EvictInfo[K]) -> None:
    """Take `rec` out of the candidates placed in `window` (it found no place to go)."""
    for _, items in window.placed.values():
        for i, item in enumerate(items):
            if item[1] is rec:
                del items[i]
                return


_MOVABLE = frozenset({Verdict.PRIMARY, Verdict.DROPPABLE, Verdict.SOFT_PINNED})
