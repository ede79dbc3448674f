"""Mounted segments: who owns each, where its bytes are reached, and its offset allocator.

A `Segment` record lives from mount to unmount. Unmounting flips `alive` off and drops the
allocator; replicas keep pointing at the dead record, which is how every reader knows in O(1)
that such a replica is gone (the master sweeps them out of the metadata in the background).
Mounting the same name again creates a *new* record with a new `number`, so a replica of the
old mount can never be mistaken for one of the new.

A segment whose owner fell silent (past `client_ttl`) stays mounted, allocator and replicas
kept, but stops *serving*: `serving` goes off and it leaves the `live` list, so placement,
arenas and task targets skip it and readers are not offered its replicas; `restore` puts it
back (docs/parts/reliability.md). `alive` means mounted (its allocator exists); `serving`
means mounted and not silent, which is what a reader checks.

A disk-tier segment (`kind` LOCAL_DISK: a node's preallocated offload file) is kept in `disks`,
never in `live`: placement, arenas, swap-out, capacity and pressure never see it; only the
tier manager (`tiers.py`) allocates there (docs/parts/tiers.md).
"""

from __future__ import annotations

from kvpool.master.allocator import OffsetAllocator
from kvpool.protocol.messages import (
    ClientId,
    HostId,
    ReplicaKind,
    SegmentInfo,
    SegmentName,
    SegmentStats,
)

__all__ = ["Segment", "SegmentTable"]


class Segment:
    """One mounted memory segment (a slotted record: there are few, but replicas point here)."""

    __slots__ = (
        "alive",
        "allocator",
        "client_id",
        "draining",
        "endpoint",
        "generation",
        "host_id",
        "kind",
        "name",
        "number",
        "objects",
        "serving",
        "shm_path",
        "size",
    )

    def __init__(
        self,
        *,
        number: int,
        name: SegmentName,
        size: int,
        client_id: ClientId,
        host_id: HostId,
        endpoint: str,
        shm_path: str,
        alignment: int,
        generation: int = 0,
        kind: ReplicaKind = ReplicaKind.MEMORY,
    ) -> None:
        self.kind = kind
        self.number = number
        self.name = name
        self.size = size
        self.client_id = client_id
        self.host_id = host_id
        self.endpoint = endpoint
        self.shm_path = shm_path
        self.allocator = OffsetAllocator(size, alignment)
        self.generation = generation
        self.alive = True
        #: Mounted and its owner not silent: readers may be sent here, placement may use it.
        self.serving = True
        self.objects = 0  # replicas currently allocated here
        #: Gracefully unmounting (`master/drain.py`): readable, but out of `live`, so no new
        #: replica, arena or task target is placed here.
        self.draining = False

    @property
    def silent(self) -> bool:
        """Mounted, but its owner is silent (kept, neither read nor written)."""
        return self.alive and not self.serving

    def same_mount(self, info: SegmentInfo, client_id: ClientId, host_id: HostId) -> bool:
        """Whether mounting `info` again would describe exactly this segment (idempotence)."""
        return (
            info.size == self.size
            and client_id == self.client_id
            and (info.host_id or host_id) == self.host_id
            and info.endpoint == self.endpoint
            and info.shm_path == self.shm_path
            and info.generation == self.generation
            and info.kind == self.kind
        )

    def info(self) -> SegmentInfo:
        return SegmentInfo(
            self.name,
            self.size,
            self.host_id,
            self.endpoint,
            self.shm_path,
            self.client_id,
            self.generation,
            self.kind,
        )

    def stats(self) -> SegmentStats:
        return SegmentStats(
            self.name,
            self.client_id,
            self.host_id,
            self.endpoint,
            self.allocator.capacity,
            self.allocator.allocated,
            self.objects,
        )


class SegmentTable:
    """The live segments by name, plus a list of them for placement (kept in mount order)."""

    __slots__ = ("_alignment", "_by_name", "_next_number", "disks", "live")

    def __init__(self, alignment: int) -> None:
        self._alignment = alignment
        self._by_name: dict[SegmentName, Segment] = {}
        self._next_number = 1
        self.live: list[Segment] = []
        #: Serving disk-tier segments (LOCAL_DISK), kept apart from `live` (memory).
        self.disks: list[Segment] = []

    def _list(self, seg: Segment) -> list[Segment]:
        return self.live if seg.kind is ReplicaKind.MEMORY else self.disks

    def get(self, name: SegmentName) -> Segment | None:
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self._by_name)

    def mount(self, info: SegmentInfo, client_id: ClientId, host_id: HostId) -> Segment:
        """A new live segment; the caller has checked that `info.name` is not mounted."""
        seg = Segment(
            number=self._next_number,
            name=info.name,
            size=info.size,
            client_id=client_id,
            host_id=info.host_id or host_id,
            endpoint=info.endpoint,
            shm_path=info.shm_path,
            alignment=self._alignment,
            generation=info.generation,
            kind=ReplicaKind(info.kind),
        )
        self._next_number += 1
        self._by_name[seg.name] = seg
        self._list(seg).append(seg)
        return seg

    def silence(self, seg: Segment) -> None:
        """Stop serving `seg` (its owner fell silent); everything it holds is kept."""
        if seg.serving:
            seg.serving = False
            lst = self._list(seg)
            if seg in lst:  # a draining segment has left it already
                lst.remove(seg)

    def restore(self, seg: Segment) -> None:
        """Serve the silent `seg` again (its owner came back with the same memory)."""
        if seg.alive and not seg.serving:
            seg.serving = True
            if not seg.draining:
                self._list(seg).append(seg)

    def drain(self, seg: Segment) -> None:
        """Take `seg` out of placement (GRACEFULLY_UNMOUNTING): still mounted and readable."""
        if seg.alive and not seg.draining:
            seg.draining = True
            lst = self._list(seg)
            if seg in lst:
                lst.remove(seg)

    def mounted(self) -> list[Segment]:
        """Every mounted segment, silent ones included."""
        return list(self._by_name.values())

    def unmount(self, seg: Segment) -> None:
        """Take `seg` out of the pool: unreadable and unallocatable from now on."""
        seg.alive = False
        del self._by_name[seg.name]
        lst = self._list(seg)
        if seg in lst:
            lst.remove(seg)
        seg.serving = False
        # Every range of the segment goes with it; nothing may be freed into it again.
        seg.allocator = OffsetAllocator(0, self._alignment)
        seg.objects = 0

    def capacity(self) -> tuple[int, int]:
        """(capacity, used) bytes over all live segments."""
        cap = used = 0
        for seg in self.live:
            cap += seg.allocator.capacity
            used += seg.allocator.allocated
        return cap, used
