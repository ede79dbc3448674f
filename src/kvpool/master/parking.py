"""Parked ranges: allocated ranges that nothing owns any more, kept until a writer is surely done.

A range is parked when the master lets go of it while someone may still write into (or read
from) it: the replicas of a preempted, force-removed or expired client's PutStart (until
`put_start_release_timeout` after it started), the old ranges of an object rewritten under a
live read lease or a moved replica's source (until the lease ends), the gaps of an expired
client's arenas, the targets of a task that failed while its executor may still be copying.
Until its release time a parked range stays allocated, so no new object lands where a late
write could.

`ParkedRanges` only keeps the list, ordered by release time (a heap); `MetadataCore` (`core.py`)
parks and frees, since freeing a range changes its segment's allocator. The master's monitor
frees what is due once a second (`release_stale`, `admin.py`); a put that finds no room frees
what is due at once, and one refused while memory parked on a mounted segment is released
within `PARKED_HINT_S` is told to ask again when it is (`hint_ms`): the pool will have room
then, whatever the machine's speed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Final

from kvpool.master.metadata import Replica
from kvpool.master.segments import Segment
from kvpool.protocol.messages import ReplicaKind

__all__ = ["PARKED_HINT_S", "ParkedRanges"]

PARKED_HINT_S: Final = 1.0
"""A put refused while memory parked on a mounted segment is released within this long is
told to ask again then (`ParkedRanges.hint_ms`); a later release does not hold it waiting."""
_HINT_SCAN: Final = 1024
"""Parked sets looked at, at most, for one refused put's hint."""
_MEMORY: Final = ReplicaKind.MEMORY


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

    def due(self, now: float) -> bool:
        """Whether the release time of a parked set has come."""
        return bool(self._heap) and self._heap[0][0] <= now

    def hint_ms(self, now: float) -> int:
        """Milliseconds (at least 1) until the first parked set holding memory of a mounted
        segment is released, when that is within `PARKED_HINT_S`; 0 when none is (looking at
        `_HINT_SCAN` sets at most: the heap's front, where the earliest are)."""
        first = now + PARKED_HINT_S
        found = False
        for until, _, _, reps in itertools.islice(self._heap, _HINT_SCAN):
            if until <= first and any(r.kind is _MEMORY and r.segment.alive for r in reps):
                first, found = until, True
        return max(1, int((first - now) * 1000) + 1) if found else 0

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
