"""kvpool.ha.lease: the keeper's local deadline, its renewal, and its loss."""

from __future__ import annotations

import time

import pytest

from kvpool.errors import InvalidParams
from kvpool.ha import EtcdGateway, LeaseConfig, LeaseKeeper
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
