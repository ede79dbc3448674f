"""Parked ranges: allocated ranges that nothing owns any more, kept until a writer is surely done.

A range is parked when the master lets go of it while someone may still write into (or read
from) it: the replicas of a preempted, force-removed or expired client's PutStart (until
`put_start_release_timeout` after it started), the old ranges of an object rewritten under a
live read lease or a moved replica's source (until the lease ends), the gaps of an expired
client's arenas, the targets of a task that failed while its executor may still be copying.
Until its release time a parked range stays allocated, so no new object lands where a late
write could.

`ParkedRanges` only keeps the list, ordered by release time (a heap); `MetadataCore` (`core.py`)
parks and frees, since freeing a range changes its segment's allocator.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from kvpool.master.metadata import Replica
from kvpool.master.segments import Segment

__all__ = ["ParkedRanges"]


class ParkedRanges:
    """Parked replicas by release time: (release_at, seq, object size, replicas)."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, tuple[Replica, ...]]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, release_at: float, size: int, replicas: tuple[Replica, ...]) -> None:
        """Keep `replicas` (each `size` bytes) parked until `release_at`."""
        self._seq += 1
        heapq.heappush(self._heap, (release_at, self._seq, size, replicas))

    def pop_due(self, now: float) -> Iterator[tuple[int, tuple[Replica, ...]]]:
        """Take out every set whose release time has come: (size, replicas) each."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, size, replicas = heapq.heappop(heap)
            yield size, replicas

    def on_segment(self, seg: Segment, now: float) -> list[tuple[int, int, float]]:
        """(offset, size, release_at) of every range parked on `seg` and not yet due."""
        return [
            (r.offset, size, until)
            for until, _, size, reps in self._heap
            if until > now
            for r in reps
            if r.segment is seg
        ]

    def replicas(self) -> list[tuple[Replica, int]]:
        """Every parked replica with its object size."""
        return [(r, size) for _, _, size, reps in self._heap for r in reps]
