"""Placement: which segments get an object's replicas, allocated in one step.

`preferred_segments` are tried first, in the caller's order; the strategy then orders the
remaining live segments: `random` (a random starting point in the mount list, so the load
spreads without sorting), `free_ratio_first` (largest free fraction first) or `local_first`
(segments on the writer's host first, then random); `prefer_alloc_in_same_node` asks for
`local_first` on one request. Replicas of one object always land on distinct segments, and
`replica_num` is best effort: with fewer segments (or fewer with room) there are fewer replicas,
as in Mooncake. `exclude_segments` are never chosen. The work is O(segments) per object; the number of segments is small (nodes).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvpool.master.config import AllocationStrategy
from kvpool.master.segments import Segment, SegmentTable
from kvpool.protocol.messages import HostId, SegmentName

# Read per placement: module constants, not `Enum.MEMBER` (EnumType.__getattr__ on 3.11).
_FREE_RATIO_FIRST = AllocationStrategy.FREE_RATIO_FIRST
_LOCAL_FIRST = AllocationStrategy.LOCAL_FIRST

__all__ = ["Placement"]


class Placement:
    """Chooses segments and allocates the ranges for a new object's replicas."""

    __slots__ = ("_random", "strategy")

    def __init__(self, strategy: AllocationStrategy, rng: random.Random) -> None:
        self.strategy = strategy
        self._random = rng.random

    def allocate(
        self,
        table: SegmentTable,
        size: int,
        replica_num: int,
        *,
        preferred: Sequence[SegmentName] = (),
        exclude: Sequence[SegmentName] = (),
        local_host: HostId | None = None,
        local_first: bool = False,
    ) -> list[tuple[Segment, int]]:
        """Up to `replica_num` `(segment, offset)` on distinct segments, none of them in
        `exclude`; [] when none had room."""
        live = table.live
        n = len(live)
        if not n:
            return []
        strategy = self.strategy
        if local_first and local_host:
            strategy = AllocationStrategy.LOCAL_FIRST
        if (
            replica_num == 1
            and not preferred
            and not exclude
            and strategy is AllocationStrategy.RANDOM
        ):
            one = self.one_random(live, size)
            return [one] if one is not None else []
        chosen: list[tuple[Segment, int]] = []
        used: set[int] = set()  # segment numbers taken, or excluded
        for name in exclude:
            seg_or_none = table.get(name)
            if seg_or_none is not None:
                used.add(seg_or_none.number)
        for name in preferred:
            seg_or_none = table.get(name)
            if (
                seg_or_none is not None
                and seg_or_none.serving  # a silent segment takes no new replica
                and not seg_or_none.draining  # nor one being drained
                and seg_or_none.number not in used
            ):
                self._try(seg_or_none, size, chosen, used)
                if len(chosen) >= replica_num:
                    return chosen
        for seg in self._order(live, strategy, local_host):
            if seg.number not in used:
                self._try(seg, size, chosen, used)
                if len(chosen) >= replica_num:
                    break
        return chosen

    def one_random(
        self, live: list[Segment], size: int, *, count: bool = True
    ) -> tuple[Segment, int] | None:
        """One range on a random segment with room (from a random start, in mount order):
        the path of a plain one-replica put, kept free of any list building. `count`: the
        range is one replica (False: a region the caller cuts and counts itself)."""
        n = len(live)
        if n:
            start = int(self._random() * n)
            for i in range(n):
                seg = live[(start + i) % n]
                off = seg.allocator.alloc(size)
                if off is not None:
                    if count:
                        seg.objects += 1
                    return seg, off
        return None

    @staticmethod
    def _try(seg: Segment, size: int, chosen: list[tuple[Segment, int]], used: set[int]) -> None:
        off = seg.allocator.alloc(size)
        if off is not None:
            seg.objects += 1
            chosen.append((seg, off))
            used.add(seg.number)

    def _order(
        self, live: list[Segment], strategy: AllocationStrategy, local_host: HostId | None
    ) -> list[Segment]:
        n = len(live)
        start = int(self._random() * n)
        rotated = live[start:] + live[:start]
        if strategy is _FREE_RATIO_FIRST:
            return sorted(
                rotated,
                key=lambda s: (
                    -(s.allocator.free_bytes / s.allocator.capacity)
                    if s.allocator.capacity
                    else 0.0
                ),
            )
        if strategy is _LOCAL_FIRST and local_host:
            return [s for s in rotated if s.host_id == local_host] + [
                s for s in rotated if s.host_id != local_host
            ]
        return rotated
