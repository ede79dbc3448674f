"""kvpool.ha.lease: the keeper's local deadline, its renewal, and its loss."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kvpool.errors import InvalidParams
from kvpool.ha import EtcdGateway, LeaseConfig, LeaseKeeper
from kvpool.ha.coordinator import Coordinator, CoordinatorUnavailable, Lease, LeaseId
from kvtest.etcd import EtcdServer
from kvtest.procs import wait_until


def test_config_derives_timing_from_the_ttl() -> None:
    c = LeaseConfig(ttl=6)
    assert (c.interval, c.margin, c.timeout, c.retry) == (2.0, 1.2, 1.0, 0.5)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"ttl": 0}, "whole seconds"),
        ({"ttl": 2.5}, "whole seconds"),
        ({"ttl": 5, "safety_margin": -1}, "safety_margin"),
        ({"ttl": 5, "keepalive_interval": float("nan")}, "keepalive_interval"),
        ({"ttl": 2, "keepalive_interval": 1.5, "safety_margin": 0.5}, "must be below the ttl"),
    ],
)
def test_bad_configs_are_refused(kwargs: dict[str, float], says: str) -> None:
    with pytest.raises(InvalidParams, match=says):
        LeaseConfig(**kwargs)  # type: ignore[arg-type]


def test_keepalives_push_the_deadline_forward(gateway: EtcdGateway) -> None:
    keeper = LeaseKeeper(gateway, LeaseConfig(ttl=2))
    try:
        before = time.monotonic()
        lease = keeper.grant()
        assert lease.ttl == 2 and keeper.valid()
        first = keeper.deadline
        # Sent no earlier than `before`, so surely alive until before + ttl; we trust less.
        assert before + 2 - 0.4 <= first <= time.monotonic() + 2 - 0.4
        wait_until(lambda: keeper.deadline > first, 3, what="a keepalive")
        assert gateway.keepalive(lease.id) == 2
    finally:
        assert keeper.revoke() is True
    assert not keeper.valid() and keeper.lost_reason == "revoked"
    assert gateway.keepalive(lease.id) == 0


def test_a_lease_revoked_behind_the_keepers_back_is_lost(gateway: EtcdGateway) -> None:
    reasons: list[str] = []
    keeper = LeaseKeeper(gateway, LeaseConfig(ttl=2), on_lost=reasons.append)
    try:
        lease = keeper.grant()
        gateway.revoke(lease.id)
        assert keeper.lost.wait(3)
        assert not keeper.valid()
        wait_until(lambda: reasons, 2, what="on_lost")  # it runs just after `lost` is set
        assert reasons == [f"etcd no longer knows lease {lease.id}"]
    finally:
        keeper.close()


def test_with_etcd_frozen_the_deadline_passes_before_etcd_could_expire_the_lease(
    etcd: EtcdServer,
) -> None:
    gw = EtcdGateway([etcd.endpoint], timeout=1.0)
    keeper = LeaseKeeper(gw, LeaseConfig(ttl=2))
    try:
        keeper.grant()
        etcd.freeze()
        frozen_at = time.monotonic()
        assert keeper.lost.wait(3)
        lost_at = time.monotonic()
        # The last keepalive was sent before the freeze, so etcd keeps the lease at least until
        # frozen_at + ttl would have passed had it been running; the keeper gave up earlier.
        assert keeper.deadline <= frozen_at + 2 - 0.4 + 0.01
        assert lost_at - keeper.deadline < 0.3  # and noticed it on time
        assert "deadline" in keeper.lost_reason
    finally:
        etcd.thaw()
        keeper.close()
        gw.close()


def test_grant_twice_is_refused(gateway: EtcdGateway) -> None:
    keeper = LeaseKeeper(gateway, LeaseConfig(ttl=2))
    try:
        keeper.grant()
        with pytest.raises(InvalidParams, match="twice"):
            keeper.grant()
    finally:
        keeper.revoke()


class _SilentEtcd(Coordinator):
    """A Coordinator whose etcd grants one lease, then never answers a keepalive."""

    def __init__(self) -> None:
        self.keepalives = 0

    def grant(self, ttl: int, *, timeout: float | None = None) -> Lease:
        return Lease(LeaseId(1), ttl)

    def keepalive(self, lease: LeaseId, *, timeout: float | None = None) -> int:
        self.keepalives += 1
        raise CoordinatorUnavailable("etcd does not answer")

    def revoke(self, lease: LeaseId, *, timeout: float | None = None) -> bool:
        raise CoordinatorUnavailable("etcd does not answer")

    def get(self, key: bytes, *, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def get_prefix(self, prefix: bytes, *, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def put(self, key: bytes, value: bytes, *, lease: Any = None, timeout: Any = None) -> int:
        raise NotImplementedError

    def delete(self, key: bytes, *, timeout: float | None = None) -> bool:
        raise NotImplementedError

    def txn(
        self, compares: Any, writes: Any, *, read_on_failure: Any = (), timeout: Any = None
    ) -> Any:
        raise NotImplementedError

    def watch(
        self, key: bytes, *, prefix: bool = False, start_revision: int = 0, timeout: Any = None
    ) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_validity_follows_the_clock_not_the_keeper_thread() -> None:
    # A process resumed after SIGSTOP sees its clock jump; valid() must not wait for its thread.
    now = [100.0]
    keeper = LeaseKeeper(_SilentEtcd(), LeaseConfig(ttl=5), clock=lambda: now[0])
    try:
        keeper.grant()
        assert keeper.deadline == 100.0 + 5 - 1.0  # sent at 100, TTL 5, margin TTL/5
        now[0] = 103.99
        assert keeper.valid()
        now[0] = 104.0
        assert not keeper.valid()
    finally:
        keeper.close()
    assert keeper.lost_reason == "closed"
    assert keeper.revoke() is False  # an unreachable etcd: revoke never raises
