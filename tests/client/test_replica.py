"""Replica choice (local COMPLETE memory replica first) and the read acceptance checks."""

from __future__ import annotations

import time

import pytest
import xxhash

from kvpool.client.replica import (
    checksum,
    lease_deadline,
    order_replicas,
    verify_checksum,
    verify_lease,
)
from kvpool.errors import ChecksumMismatch, ErrorCode, LeaseExpired
from kvpool.protocol.messages import ReplicaDesc, ReplicaKind, ReplicaStatus, SegmentName


def rep(
    i: int,
    seg: str,
    kind: ReplicaKind = ReplicaKind.MEMORY,
    status: ReplicaStatus = ReplicaStatus.COMPLETE,
) -> ReplicaDesc:
    return ReplicaDesc(i, kind, status, SegmentName(seg), 0, 10)


def test_local_complete_memory_replica_comes_first() -> None:
    reps = [rep(1, "remote-a"), rep(2, "local"), rep(3, "remote-b")]
    order = order_replicas(reps, lambda s: s == "local")
    assert [r.replica_id for r in order] == [2, 1, 3]


def test_without_a_local_replica_the_masters_order_is_kept() -> None:
    reps = [rep(1, "a"), rep(2, "b")]
    assert [r.replica_id for r in order_replicas(reps, lambda s: False)] == [1, 2]


def test_incomplete_replicas_are_never_chosen_and_memory_comes_before_dfs_before_disk() -> None:
    reps = [
        rep(1, "local", status=ReplicaStatus.PROCESSING),
        rep(2, "local", kind=ReplicaKind.LOCAL_DISK),
        rep(3, "remote"),
        rep(4, "remote", kind=ReplicaKind.DFS),
    ]
    # Seed 000's order: memory, then DFS (a file in the shared directory), then a disk tier.
    assert [r.replica_id for r in order_replicas(reps, lambda s: s == "local")] == [3, 4, 2]
    assert order_replicas([rep(1, "x", status=ReplicaStatus.PROCESSING)], lambda s: True) == []


def test_checksum_is_xxh3_64_of_the_value() -> None:
    data = b"kv cache bytes" * 100
    assert checksum(data) == xxhash.xxh3_64_intdigest(data)
    verify_checksum("k", memoryview(data), checksum(data))
    verify_checksum("k", memoryview(data), None)  # nothing recorded: nothing to check
    with pytest.raises(ChecksumMismatch) as info:
        verify_checksum("k", memoryview(data[:-1] + b"X"), checksum(data))
    assert info.value.code == ErrorCode.CHECKSUM_MISMATCH


def test_a_read_after_the_lease_ran_out_is_refused() -> None:
    now = time.monotonic()
    verify_lease("k", lease_deadline(now, 10_000))
    verify_lease("k", lease_deadline(now - 100, 0))  # no lease granted: nothing to check
    with pytest.raises(LeaseExpired) as info:
        verify_lease("k", lease_deadline(now - 1.0, 500))
    assert info.value.code == ErrorCode.LEASE_EXPIRED
