"""`DiskLru`: the replicas on each disk-tier segment, least recently used first.

The master allocates every range of a disk tier (`kvpool.master.tiers`), so it also keeps the
tier's LRU: a replica enters when it becomes COMPLETE there (an offload or a move finished, a
restarted node registered it), moves to the back when a read is served from disk, and leaves
when its range is freed (`MetadataCore.on_disk_free`). When an offload finds no disk with room,
the tier manager walks a bounded number of the oldest entries of a disk segment and drops what
may go (docs/parts/tiers.md, "The disk tier's LRU").

Entries are checked when they are used, not kept exact: an entry whose object no longer holds
that range (removed, overwritten, the segment unmounted) is dropped then. One entry per disk
replica, like the metadata itself.
"""

from __future__ import annotations

from collections import OrderedDict

from kvpool.master.metadata import ObjectMeta
from kvpool.master.segments import Segment
from kvpool.protocol.messages import ReplicaKind

__all__ = ["DiskLru"]

_DISK = ReplicaKind.LOCAL_DISK


class DiskLru:
    """Per disk segment: offset -> object, oldest first. Used on the master's loop only."""

    __slots__ = ("_by_seg",)

    def __init__(self) -> None:
        self._by_seg: dict[Segment, OrderedDict[int, ObjectMeta]] = {}

    def __len__(self) -> int:
        return sum(len(od) for od in self._by_seg.values())

    def add(self, obj: ObjectMeta) -> None:
        """`obj`'s disk replicas are (newly) complete: each goes to the back of its segment."""
        for r in obj.replicas:
            if r.kind is _DISK:
                od = self._by_seg.setdefault(r.segment, OrderedDict())
                od[r.offset] = obj
                od.move_to_end(r.offset)

    def touch(self, obj: ObjectMeta) -> None:
        """A read of `obj` was served from disk: its disk replicas go to the back."""
        for r in obj.replicas:
            if r.kind is _DISK:
                od = self._by_seg.get(r.segment)
                if od is not None and od.get(r.offset) is obj:
                    od.move_to_end(r.offset)

    def remove(self, seg: Segment, offset: int) -> None:
        """The range at `offset` of `seg` was freed."""
        od = self._by_seg.get(seg)
        if od is not None:
            od.pop(offset, None)
            if not od:
                del self._by_seg[seg]

    def oldest(self, seg: Segment, limit: int) -> list[tuple[int, ObjectMeta]]:
        """Up to `limit` entries of `seg`, least recently used first (a copy)."""
        od = self._by_seg.get(seg)
        if not od:
            return []
        out: list[tuple[int, ObjectMeta]] = []
        for item in od.items():
            out.append(item)
            if len(out) >= limit:
                break
        return out

    def prune(self) -> None:
        """Forget the segments that were unmounted (their allocators went with them)."""
        for seg in [s for s in self._by_seg if not s.alive]:
            del self._by_seg[seg]
