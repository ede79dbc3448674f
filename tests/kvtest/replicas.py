"""What a Store says of a key's replicas, as tests check it: their kinds, where their bytes are."""

from __future__ import annotations

from kvpool.client import Store
from kvpool.errors import KVPoolError
from kvpool.protocol.messages import ReplicaKind

__all__ = ["OFFSET_MASK", "dfs_file_id", "kinds", "kinds_if_stored", "replica_offset"]

#: A replica id is the segment number << 44 | the offset in the segment.
OFFSET_MASK = (1 << 44) - 1


def kinds(s: Store, key: str) -> list[ReplicaKind]:
    """The kinds of `key`'s replicas, sorted (MEMORY, LOCAL_DISK, DFS)."""
    return sorted(ReplicaKind(r.kind) for r in s.get_replica_desc(key))


def kinds_if_stored(s: Store, key: str) -> list[ReplicaKind]:
    """`kinds(s, key)`, or [] when the master answers with an error (the key is gone)."""
    try:
        return kinds(s, key)
    except KVPoolError:
        return []


def dfs_file_id(s: Store, key: str) -> int:
    """The id of `key`'s DFS file (its DFS replica's offset)."""
    return next(r.offset for r in s.get_replica_desc(key) if r.kind == ReplicaKind.DFS)


def replica_offset(s: Store, key: str, kind: ReplicaKind) -> int:
    """Where `key`'s first replica of `kind` starts in its segment (its id's offset part)."""
    r = next(r for r in s.get_replica_desc(key) if r.kind == kind)
    return r.replica_id & OFFSET_MASK
