"""Which replica a read tries first, and what makes a read's bytes acceptable.

Replica choice follows Mooncake's client: COMPLETE memory replicas come first, the first one
whose segment lives on this host first (a same-host read is one memcpy from the owner's shared
memory), then the others in the master's order; COMPLETE disk-tier replicas (LOCAL_DISK, read
through their node's transfer server, or memcpy from the mapped file in the node itself) follow,
the same way. A read that fails on one replica
moves to the next, so the returned order is the whole retry plan.

A read is accepted when its bytes hash to the checksum recorded at PutEnd (xxh3_64, which costs
little next to the copy) and when it finished before its read lease ran out: after the lease the
master may have evicted or overwritten the replica, so bytes read late are not trusted
(LEASE_EXPIRED, as Mooncake checks after its memory reads).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final

import xxhash

from kvpool.errors import ChecksumMismatch, LeaseExpired
from kvpool.protocol.messages import ReplicaDesc, ReplicaKind, ReplicaStatus, SegmentName

__all__ = [
    "checksum",
    "digest_or_checksum",
    "lease_deadline",
    "order_replicas",
    "verify_checksum",
    "verify_lease",
]


def checksum(data: memoryview | bytes | bytearray) -> int:
    """xxh3_64 of a whole value, as recorded at PutEnd."""
    return int(xxhash.xxh3_64_intdigest(data))


def digest_or_checksum(digest: int | None, view: memoryview) -> int:
    """`digest` when the copy took it (`DataPath.move_many`), else the value's checksum now."""
    return checksum(view) if digest is None else digest


def order_replicas(
    replicas: Sequence[ReplicaDesc], is_local: Callable[[SegmentName], bool]
) -> list[ReplicaDesc]:
    """Readable replicas: memory ones first (the first local one first, then the rest in the
    given order), then DFS ones (files in the shared directory, seed 000's memory -> DFS ->
    disk order), then disk-tier (LOCAL_DISK) ones, the first local one first.

    `is_local(segment)` says whether a segment lives on this host. An empty result means no
    replica is readable (the caller answers REPLICA_IS_NOT_READY or INVALID_REPLICA).
    """
    if len(replicas) == 1:  # the common case: no choice to make
        r = replicas[0]
        ok = r.kind in _READABLE_KINDS and r.status == ReplicaStatus.COMPLETE
        return [r] if ok else []
    complete = [r for r in replicas if r.status == ReplicaStatus.COMPLETE]
    out: list[ReplicaDesc] = []
    for kind in _READABLE_KINDS:
        tier = [r for r in complete if r.kind == kind]
        for i, r in enumerate(tier if kind != ReplicaKind.DFS else ()):  # DFS: no host
            if is_local(r.segment):
                if i:
                    tier.insert(0, tier.pop(i))
                break
        out += tier
    return out


_READABLE_KINDS: Final = (ReplicaKind.MEMORY, ReplicaKind.DFS, ReplicaKind.LOCAL_DISK)
"""Replica kinds a reader reads, in the order it prefers them."""


def lease_deadline(started: float, lease_ttl_ms: int) -> float:
    """The monotonic time after which a read that asked for its lease at `started` is too late.

    Counted from before the request left, so network time only ever makes the check stricter.
    A TTL of 0 means the master grants no lease and there is nothing to check.
    """
    if lease_ttl_ms <= 0:
        return float("inf")
    return started + lease_ttl_ms / 1000.0


def verify_lease(key: str, deadline: float) -> None:
    """Raise LEASE_EXPIRED when the read finished after its lease ran out."""
    if time.monotonic() > deadline:
        raise LeaseExpired(f"{key!r}: the read finished after its lease expired")


def verify_checksum(
    key: str, data: memoryview, expected: int | None, got: int | None = None
) -> None:
    """Raise CHECKSUM_MISMATCH unless `data` hashes to `expected` (None: nothing recorded);
    `got` is the hash when the copy already took it."""
    if expected is not None:
        if got is None:
            got = checksum(data)
        if got != expected:
            raise ChecksumMismatch(
                f"{key!r}: read bytes hash to {got:#018x}, PutEnd recorded {expected:#018x}"
            )
