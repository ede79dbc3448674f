"""kvpool.ha.gateway.EtcdGateway against a real etcd: every Coordinator operation, and faults."""

from __future__ import annotations

import time

import pytest

from kvpool.ha import CoordinatorUnavailable, EtcdGateway, WatchLost
from kvpool.ha.coordinator import (
    CoordinatorError,
    Delete,
    EventType,
    ModRevisionIs,
    Put,
    prefix_end,
)
from kvtest.etcd import EtcdServer
from kvtest.procs import free_port


def test_put_get_delete_round_trip(gateway: EtcdGateway, cluster: str) -> None:
    key = f"/t/{cluster}/k".encode()
    assert gateway.get(key)[0] is None
    rev = gateway.put(key, b"\x00binary\xff")
    kv, read_rev = gateway.get(key)
    assert kv is not None and kv.value == b"\x00binary\xff"
    assert kv.create_revision == kv.mod_revision == rev and kv.version == 1 and kv.lease == 0
    assert read_rev >= rev
    assert gateway.delete(key) is True
    assert gateway.delete(key) is False
    assert gateway.get(key)[0] is None


def test_get_prefix_is_sorted_and_bounded(gateway: EtcdGateway, cluster: str) -> None:
    base = f"/t/{cluster}/".encode()
    for name in (b"b", b"a", b"c"):
        gateway.put(base + name, name)
    gateway.put(base[:-1] + b"0", b"outside")  # shares the text, not the prefix
    kvs, _ = gateway.get_prefix(base)
    assert [kv.key for kv in kvs] == [base + b"a", base + b"b", base + b"c"]
    assert prefix_end(b"a\xff") == b"b" and prefix_end(b"\xff") == b"\0"


def test_txn_applies_all_or_nothing_and_reads_on_failure(
    gateway: EtcdGateway, cluster: str
) -> None:
    a, b = f"/t/{cluster}/a".encode(), f"/t/{cluster}/b".encode()
    first = gateway.create(a, b"one")
    assert first.succeeded and first.current == {}
    second = gateway.create(a, b"two")
    assert not second.succeeded and second.current[a].value == b"one"
    kv, _ = gateway.get(a)
    assert kv is not None
    ok = gateway.txn(
        [ModRevisionIs(a, kv.mod_revision), ModRevisionIs(b, 0)], [Put(b, b"x"), Delete(a)]
    )
    assert ok.succeeded and gateway.get(a)[0] is None and gateway.get(b)[0] is not None
    stale = gateway.txn([ModRevisionIs(b, 1)], [Delete(b)], read_on_failure=[b])
    assert not stale.succeeded and stale.current[b].value == b"x"


def test_leases_grant_keepalive_revoke(gateway: EtcdGateway, cluster: str) -> None:
    key = f"/t/{cluster}/leased".encode()
    lease = gateway.grant(5)
    assert lease.id > 0 and lease.ttl == 5
    gateway.put(key, b"v", lease=lease.id)
    kv, _ = gateway.get(key)
    assert kv is not None and kv.lease == lease.id
    assert gateway.keepalive(lease.id) == 5
    assert gateway.revoke(lease.id) is True
    assert gateway.get(key)[0] is None  # revoking deletes the lease's keys at once
    assert gateway.keepalive(lease.id) == 0  # an unknown lease is an outcome, not a fault
    assert gateway.revoke(lease.id) is False


def test_a_put_on_an_unknown_lease_is_an_error(gateway: EtcdGateway, cluster: str) -> None:
    from kvpool.ha.coordinator import LeaseId

    with pytest.raises(CoordinatorError, match="lease not found"):
        gateway.put(f"/t/{cluster}/x".encode(), b"v", lease=LeaseId(12345))


def test_watch_delivers_puts_and_deletes_in_order(gateway: EtcdGateway, cluster: str) -> None:
    prefix = f"/t/{cluster}/w/".encode()
    _, rev = gateway.get(prefix)
    watch = gateway.watch(prefix, prefix=True, start_revision=rev + 1)
    try:
        gateway.put(prefix + b"1", b"a")
        gateway.put(prefix + b"2", b"b")
        gateway.delete(prefix + b"1")
        gateway.put(f"/t/{cluster}/other".encode(), b"not watched")
        events = []
        deadline = time.monotonic() + 5
        while len(events) < 3 and time.monotonic() < deadline:
            events += watch.get(0.5) or []
        assert [(e.type, e.kv.key, e.kv.value) for e in events] == [
            (EventType.PUT, prefix + b"1", b"a"),
            (EventType.PUT, prefix + b"2", b"b"),
            (EventType.DELETE, prefix + b"1", b""),
        ]
        assert watch.get(0.2) is None
    finally:
        watch.close()
    watch.close()  # idempotent


def test_watch_from_a_past_revision_replays_history(gateway: EtcdGateway, cluster: str) -> None:
    key = f"/t/{cluster}/h".encode()
    r1 = gateway.put(key, b"1")
    gateway.put(key, b"2")
    watch = gateway.watch(key, start_revision=r1)
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            got += [e.kv.value for e in watch.get(0.5) or []]
        assert got == [b"1", b"2"]
    finally:
        watch.close()


def test_an_unreachable_etcd_is_unavailable_quickly() -> None:
    gw = EtcdGateway([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"], timeout=0.5)
    try:
        t = time.monotonic()
        with pytest.raises(CoordinatorUnavailable, match="no endpoint answered"):
            gw.get(b"k")
        with pytest.raises(CoordinatorUnavailable):
            gw.watch(b"k")
        assert time.monotonic() - t < 2
    finally:
        gw.close()


def test_a_dead_endpoint_in_the_list_is_skipped(etcd_shared: EtcdServer, cluster: str) -> None:
    gw = EtcdGateway([f"127.0.0.1:{free_port()}", etcd_shared.endpoint], timeout=2.0)
    try:
        gw.put(f"/t/{cluster}/k".encode(), b"v")
        kv, _ = gw.get(f"/t/{cluster}/k".encode())
        assert kv is not None and kv.value == b"v"
    finally:
        gw.close()


def test_a_frozen_etcd_times_out_and_a_killed_one_ends_its_watches(etcd: EtcdServer) -> None:
    gw = EtcdGateway([etcd.endpoint], timeout=0.5)
    try:
        gw.put(b"k", b"v")
        watch = gw.watch(b"k")
        etcd.freeze()
        t = time.monotonic()
        with pytest.raises(CoordinatorUnavailable):
            gw.get(b"k")
        assert time.monotonic() - t < 1.5
        etcd.kill()
        with pytest.raises(WatchLost):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                watch.get(0.2)
        with pytest.raises(WatchLost):
            watch.get(0)  # and it stays ended
        watch.close()
        etcd.start()  # the same data: the key survived, and the client reconnects by itself
        kv, _ = gw.get(b"k", timeout=5)
        assert kv is not None and kv.value == b"v"
    finally:
        gw.close()
