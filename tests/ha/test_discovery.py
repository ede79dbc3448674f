"""kvpool.ha.discovery: clients find the leader, follow changes and refuse older terms."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvpool.errors import InvalidParams
from kvpool.ha import (
    ClusterKeys,
    Election,
    ElectionConfig,
    EtcdGateway,
    LeaderDiscovery,
    LeaderView,
    LeaseConfig,
    Role,
)
from kvtest.procs import wait_until

CONFIG = ElectionConfig(lease=LeaseConfig(ttl=2), retry_interval=0.2)


@pytest.fixture
def elections(gateway: EtcdGateway, cluster: str) -> Iterator[list[Election]]:
    started = [
        Election(gateway, ClusterKeys(cluster), m, f"127.0.0.1:{6000 + i}", config=CONFIG)
        for i, m in enumerate(("m1", "m2"))
    ]
    try:
        yield started
    finally:
        for e in started:
            e.close()


def _leader(elections: list[Election]) -> Election:
    return wait_until(
        lambda: next((e for e in elections if e.leading()), None), 10, what="a leader"
    )


def test_resolve_answers_none_without_a_leader_then_the_leader(
    gateway: EtcdGateway, cluster: str, elections: list[Election]
) -> None:
    discovery = LeaderDiscovery(gateway, ClusterKeys(cluster))
    assert discovery.resolve() is None and discovery.leaderless()
    elections[0].start()
    leader = _leader(elections)
    view = wait_until(discovery.refresh, 5, what="the leader via refresh")
    assert view == LeaderView(leader.member_id, leader.address, leader.state.term)
    assert discovery.current() == view and not discovery.leaderless()


def test_discovery_follows_a_leader_change(
    gateway: EtcdGateway, cluster: str, elections: list[Election]
) -> None:
    changes: list[LeaderView] = []
    discovery = LeaderDiscovery(
        gateway, ClusterKeys(cluster), resync_interval=5.0, on_change=changes.append
    )
    discovery.start()
    try:
        for e in elections:
            e.start()
        first = _leader(elections)
        seen = discovery.wait_for(1, 5)
        assert seen is not None and seen.member_id == first.member_id
        second = next(e for e in elections if e is not first)
        first.close()
        assert second.wait(lambda s: s.role is Role.LEADER, 5) is not None
        followed = discovery.wait_for(seen.term + 1, 5)
        assert followed == LeaderView(second.member_id, second.address, seen.term + 1)
        assert [v.term for v in changes] == sorted({v.term for v in changes})
    finally:
        discovery.close()
    discovery.close()  # idempotent


def test_views_from_older_terms_are_refused(gateway: EtcdGateway, cluster: str) -> None:
    discovery = LeaderDiscovery(gateway, ClusterKeys(cluster))
    new = LeaderView("b", "127.0.0.1:2", 7)
    assert discovery.offer(new)
    assert not discovery.offer(LeaderView("a", "127.0.0.1:1", 6))
    assert not discovery.offer(new)  # the same view again changes nothing
    assert discovery.current() == new
    # Even etcd answering an older leader (a stale member) does not move it back.
    gateway.put(ClusterKeys(cluster).leader, LeaderView("a", "127.0.0.1:1", 3).encode())
    assert discovery.resolve() == new


def test_a_garbage_leader_record_is_ignored(gateway: EtcdGateway, cluster: str) -> None:
    gateway.put(ClusterKeys(cluster).leader, b"not json")
    discovery = LeaderDiscovery(gateway, ClusterKeys(cluster))
    assert discovery.resolve() is None


def test_intervals_are_validated(gateway: EtcdGateway, cluster: str) -> None:
    with pytest.raises(InvalidParams, match="resync"):
        LeaderDiscovery(gateway, ClusterKeys(cluster), resync_interval=0)
