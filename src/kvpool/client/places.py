"""Where a batch answer (`LocationsReply`) puts each key: which of its places a batch read tries
first, and one key's places as a `ReplicaListReply` for the one-by-one retry of a key whose
first place failed (`kvpool.client.reader`)."""

from __future__ import annotations

from collections.abc import Callable

from kvpool.protocol.messages import (
    LocationsReply,
    ReplicaDesc,
    ReplicaKind,
    ReplicaListReply,
    ReplicaStatus,
    SegmentName,
)
from kvpool.protocol.tiers import DFS_SEGMENT

__all__ = ["first_places", "replica_list"]


def first_places(loc: LocationsReply, is_local: Callable[[SegmentName], bool]) -> list[int] | None:
    """Per key, the index in its places of the replica to read first (the first one on
    this host, as `order_replicas`), or None when every key has at most one replica."""
    if all(len(p) <= 2 for p in loc.places):
        return None
    segments = loc.segments
    local = [is_local(SegmentName(name)) for name in segments]
    for i in loc.disk_segments:  # a local disk replica is no better than remote memory
        if 0 <= i < len(local):
            local[i] = False
    first: list[int] = []
    for p in loc.places:
        j = 0
        for k in range(0, len(p), 2):
            if 0 <= p[k] < len(local) and local[p[k]]:
                j = k
                break
        first.append(j)
    return first


def replica_list(loc: LocationsReply, i: int, skip: int) -> ReplicaListReply:
    """Key `i` of `loc` as a ReplicaListReply, without the replica at `skip` (the one that
    failed), for the one-by-one retry through `Reader.read`."""
    p = loc.places[i]
    descs = [
        ReplicaDesc(
            0,
            # tiers: a DFS replica is a file, which the batch copy cannot read (so its
            # failure there is no reason to skip it); `read` reads it.
            ReplicaKind.DFS if loc.segments[p[k]] == DFS_SEGMENT else ReplicaKind.MEMORY,
            ReplicaStatus.COMPLETE,
            loc.segments[p[k]],
            p[k + 1],
            loc.sizes[i],
            loc.endpoints[p[k]],
        )
        for k in range(0, len(p), 2)
        if 0 <= p[k] < len(loc.segments)
        and p[k + 1] >= 0
        and (k != skip or loc.segments[p[k]] == DFS_SEGMENT)
    ]
    return ReplicaListReply(0, descs, loc.sizes[i], loc.checksums[i], loc.lease_ttl_ms)
