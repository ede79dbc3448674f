"""A paused node is not a dead node (issue #13), with real processes on loopback: a node frozen
(SIGSTOP) longer than `client_ttl` but shorter than `client_dead_ttl` is only silent. While it
is frozen, puts succeed on the other nodes and none lands on it; once it wakes (SIGCONT) it
remounts the same memory and every acknowledged key reads back with exact bytes. Frozen past
`client_dead_ttl` it is dropped, and comes back empty."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kvpool.client import ReplicateConfig, Store
from kvpool.errors import ObjectNotFound, ReplicaNotReady
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401
from kvtest.procs import freeze, wait_until
from kvtest.query import replica_segments, stats
from kvtest.values import random_values


def values(prefix: str, n: int, seed: int) -> dict[str, bytes]:
    return random_values(prefix, n, seed, 2000, 37)


@contextmanager
def frozen(p: Pool, index: int) -> Iterator[int]:
    """Node `index` SIGSTOPped (every thread stopped) for the block, SIGCONTed after it, also
    when the test fails."""
    pid = p.nodes[index].pid
    freeze(pid)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_node_frozen_past_client_ttl_comes_back_with_every_object(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(
        nodes=3,
        segment_size="16MiB",
        client_ttl="1s",
        master_args=("--client-dead-ttl", "60s"),
    )
    seg0 = p.node_endpoints[0] + "/0"
    before = values("before", 30, 1)
    pinned = values("on0", 5, 2)
    during = values("during", 30, 3)
    single = values("single", 30, 6)
    with Store(p.address) as s:
        for k, v in before.items():
            assert s.put(k, v, ReplicateConfig(replica_num=2))
        for k, v in pinned.items():
            assert s.put(k, v, ReplicateConfig(preferred_segments=[seg0]))
        assert all(found == {seg0} for found in replica_segments(p.address, list(pinned)))
        with frozen(p, 0):
            wait_until(
                lambda: [x.name for x in stats(p.address).silent_segments] == [seg0],
                timeout=20,
                what="the master to hold the frozen node as silent",
            )
            # Silent, not dropped: what only it holds is not offered, and a reader may retry.
            with pytest.raises(ReplicaNotReady):
                s.get("on0-0")
            for k, v in before.items():
                assert s.get(k) == v
            for k, v in during.items():
                assert s.put(k, v, ReplicateConfig(replica_num=2))
            for k, v in single.items():  # one replica: the arena path (or its fallback)
                assert s.put(k, v)
            new = list(during) + list(single)
            assert all(seg0 not in found for found in replica_segments(p.address, new))
        # Awake: it remounts the same memory and the master restores its segment.
        wait_until(
            lambda: not stats(p.address).silent_segments and len(stats(p.address).segments) == 3,
            timeout=20,
            what="the woken node to be served again",
        )
        assert seg0 in {x.name for x in stats(p.address).segments}
        for k, v in {**before, **pinned, **during, **single}.items():
            assert s.get(k) == v, k
        assert all(found == {seg0} for found in replica_segments(p.address, list(pinned)))


def test_a_node_frozen_past_client_dead_ttl_is_dropped_repaired_and_comes_back_empty(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(
        nodes=3,
        segment_size="16MiB",
        client_ttl="1s",
        master_args=("--client-dead-ttl", "2s"),
    )
    seg0 = p.node_endpoints[0] + "/0"
    pinned = values("on0", 3, 4)
    twice = values("twice", 40, 5)
    with Store(p.address) as s:
        for k, v in pinned.items():
            assert s.put(k, v, ReplicateConfig(preferred_segments=[seg0]))
        for k, v in twice.items():
            assert s.put(k, v, ReplicateConfig(replica_num=2))
        assert any(seg0 in found for found in replica_segments(p.address, list(twice)))
        with frozen(p, 0):
            wait_until(
                lambda: (
                    not stats(p.address).silent_segments
                    and seg0 not in {x.name for x in stats(p.address).segments}
                ),
                timeout=20,
                what="the master to drop the frozen node",
            )
            with pytest.raises(ObjectNotFound):
                s.get("on0-0")
            # Dropped, so what lost a replica there is copied back to 2 from the others.
            wait_until(
                lambda: all(
                    len(found) == 2 and seg0 not in found
                    for found in replica_segments(p.address, list(twice))
                ),
                timeout=30,
                interval=0.1,
                what="every replicated object to have 2 replicas again",
            )
        wait_until(
            lambda: len(stats(p.address).segments) == 3,
            timeout=20,
            what="the woken node to mount again",
        )
        for k in pinned:
            with pytest.raises(ObjectNotFound):
                s.get(k)  # it came back empty: its old memory is not trusted any more
        for k, v in twice.items():
            assert s.get(k) == v, k
