"""The master's HA with real processes: `kvpool master --ha etcd://.../CLUSTER` members on a
real etcd, a node's control plane (`kvtest.ha.FakeNode`: registers, pings, remounts) and
writers speaking the protocol. Lease TTL 2 s unless a test is about the default."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from kvpool.errors import ErrorCode, NotLeader
from kvpool.protocol.messages import (
    BatchPutEnd,
    BatchPutStart,
    BatchPutStartReply,
    BatchReply,
    ClientId,
    GetReplicaList,
    PutStart,
    ReplicaListReply,
)
from kvtest.etcd import EtcdServer
from kvtest.ha import FakeNode, HaMaster, checksum, checksums, master_rpc, put, wait_leader
from kvtest.procs import freeze, wait_until


def batch_put(m: HaMaster, client: ClientId, keys: list[str]) -> None:
    with master_rpc(m) as c:
        for i in range(0, len(keys), 512):
            part = keys[i : i + 512]
            start = c.call_as(BatchPutStart(client, part, [4096] * len(part)), BatchPutStartReply)
            assert all(r.code == 0 for r in start.results)
            end = c.call_as(BatchPutEnd(client, part, [checksum(k) for k in part]), BatchReply)
            assert end.codes == [0] * len(part)


def test_a_standby_refuses_naming_the_leader_and_takes_over_a_killed_leader_with_its_objects(
    etcd_shared: EtcdServer, cluster: str, masters: list[HaMaster], nodes: list[FakeNode]
) -> None:
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m1"))
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m2"))
    leader = wait_leader(masters)
    standby = next(m for m in masters if m is not leader)
    node = FakeNode(leader.address, cluster)
    nodes.append(node)
    keys = [f"k{i}" for i in range(200)]
    with master_rpc(leader) as c:
        for k in keys:
            put(c, node.client_id, k)
    with master_rpc(standby) as c:
        for request in (PutStart(node.client_id, "x", 10), GetReplicaList("k1")):
            with pytest.raises(NotLeader) as err:
                c.call(request)
            assert err.value.code is ErrorCode.NOT_LEADER
            assert f"leader={leader.address}" in err.value.message
    term = leader.status().term  # type: ignore[union-attr]
    wait_until(
        lambda: (s := standby.status()) is not None and s.objects == len(keys),
        10,
        what="the standby's copy to hold every object",
    )
    killed = time.monotonic()
    leader.proc.kill9()
    wait_until(
        lambda: (s := standby.status()) is not None and s.role == "leader",
        10,
        interval=0.02,
        what="the standby to lead",
    )
    node.point(standby.address)
    node.mount()  # what a node following the leader key does on its own
    with master_rpc(standby) as c:
        put(c, node.client_id, "after-failover")
    took = time.monotonic() - killed
    assert took < 2 + 2.5, took  # TTL 2 s + etcd's expiry sweep + a campaign
    status = standby.status()
    assert status is not None and status.term > term
    found = checksums(standby.address, cluster, [*keys, "after-failover"])
    assert found == {k: checksum(k) for k in [*keys, "after-failover"]}


def test_every_acknowledged_put_survives_a_kill_of_the_leader_under_a_writer(
    etcd_shared: EtcdServer, cluster: str, masters: list[HaMaster], nodes: list[FakeNode]
) -> None:
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m1"))
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m2"))
    leader = wait_leader(masters)
    standby = next(m for m in masters if m is not leader)
    node = FakeNode(leader.address, cluster)
    nodes.append(node)
    wait_until(
        lambda: (s := leader.status()) is not None and s.standbys == [standby.name],
        10,
        what="the standby to be in sync",
    )
    acked: list[str] = []
    failed: list[tuple[str, ErrorCode]] = []
    stop = threading.Event()

    def writer() -> None:
        with master_rpc(leader) as c:
            i = 0
            while not stop.is_set():
                key = f"w{i}"
                i += 1
                try:
                    put(c, node.client_id, key)
                except NotLeader as exc:
                    failed.append((key, exc.code))
                except Exception:
                    return  # the connection died with the leader
                else:
                    acked.append(key)

    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_until(lambda: len(acked) > 300, 20, what="some acknowledged puts")
        leader.proc.kill9()
    finally:
        stop.set()
        t.join(10)
    wait_leader([standby], timeout=10)
    node.point(standby.address)
    node.mount()
    found = checksums(standby.address, cluster, acked)
    lost = [k for k in acked if found.get(k) != checksum(k)]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged puts lost: {lost[:10]}"


def test_a_frozen_leader_is_replaced_and_acknowledges_nothing_when_it_wakes(
    etcd_shared: EtcdServer, cluster: str, masters: list[HaMaster], nodes: list[FakeNode]
) -> None:
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m1"))
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m2"))
    old = wait_leader(masters)
    new = next(m for m in masters if m is not old)
    node = FakeNode(old.address, cluster)
    nodes.append(node)
    with master_rpc(old) as c:
        put(c, node.client_id, "before")
    wait_until(lambda: (s := new.status()) is not None and s.objects == 1, 10, what="copy")
    late = master_rpc(old)
    late.connect()
    freeze(old.proc.pid)
    outcome: list[object] = []

    def send_while_frozen() -> None:
        try:
            outcome.append(late.call(PutStart(node.client_id, "during", 10), timeout=30))
        except Exception as exc:
            outcome.append(exc)

    t = threading.Thread(target=send_while_frozen)
    t.start()
    try:
        wait_leader([new], timeout=15)
        node.point(new.address)
        node.mount()
        with master_rpc(new) as c:
            put(c, node.client_id, "at-new")
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
    t.join(30)
    late.close()
    (result,) = outcome
    assert isinstance(result, NotLeader), result
    # Every later write to the old leader is refused, and nothing it took is visible.
    with master_rpc(old) as c:
        for key in ("after-1", "after-2"):
            with pytest.raises(NotLeader) as err:
                put(c, node.client_id, key)
            assert err.value.code in (ErrorCode.NOT_LEADER, ErrorCode.LEADER_CHANGED)
    found = checksums(new.address, cluster, ["before", "at-new", "during", "after-1"])
    assert found == {"before": checksum("before"), "at-new": checksum("at-new")}
    wait_until(
        lambda: (s := old.status()) is not None and s.role == "standby",
        10,
        what="the old leader to follow the new one",
    )
    # The deposed member's copy now comes from the new leader; it leads with it next time.
    with master_rpc(new) as c:
        put(c, node.client_id, "later")
    wait_until(
        lambda: (s := old.status()) is not None and s.objects == 3,
        10,
        what="the old leader's copy of the new leader's metadata",
    )
    new.proc.kill9()
    wait_leader([old], timeout=10)
    node.point(old.address)
    node.mount()
    keys = ["before", "at-new", "later", "during", "after-1"]
    assert checksums(old.address, cluster, keys) == {
        k: checksum(k) for k in ("before", "at-new", "later")
    }


def test_a_late_standby_bootstraps_from_a_snapshot_then_the_log_and_can_take_over(
    etcd_shared: EtcdServer, cluster: str, masters: list[HaMaster], nodes: list[FakeNode]
) -> None:
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m1"))
    leader = wait_leader(masters)
    node = FakeNode(leader.address, cluster)
    nodes.append(node)
    first = [f"a{i}" for i in range(5000)]
    batch_put(leader, node.client_id, first)
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m2"))
    late = masters[1]
    wait_until(
        lambda: (s := leader.status()) is not None and s.standbys == ["m2"],
        15,
        what="the late standby to be in sync",
    )
    second = [f"b{i}" for i in range(500)]
    batch_put(leader, node.client_id, second)
    with master_rpc(leader) as c:
        c.call_as(GetReplicaList("a1"), ReplicaListReply)
    leader.proc.kill9()
    wait_leader([late], timeout=10)
    node.point(late.address)
    node.mount()
    everything = first + second
    found = checksums(late.address, cluster, everything)
    assert len(found) == len(everything)
    assert all(found[k] == checksum(k) for k in everything)


def test_a_leader_answers_reads_while_etcd_is_away_and_an_election_follows_its_return(
    etcd: EtcdServer, cluster: str, masters: list[HaMaster], nodes: list[FakeNode]
) -> None:
    masters.append(HaMaster(etcd.endpoint, cluster, "m1"))
    leader = wait_leader(masters)
    node = FakeNode(leader.address, cluster)
    nodes.append(node)
    with master_rpc(leader) as c:
        put(c, node.client_id, "kept")
    term = leader.status().term  # type: ignore[union-attr]
    etcd.freeze()
    try:
        away = time.monotonic()
        with master_rpc(leader) as c:
            while time.monotonic() - away < 10:
                reply = c.call_as(GetReplicaList("kept"), ReplicaListReply)
                assert reply.code == 0 and reply.checksum == checksum("kept")
                time.sleep(0.2)
            # Past the lease's local deadline: no write is served.
            with pytest.raises(NotLeader):
                put(c, node.client_id, "refused")
    finally:
        etcd.thaw()
    wait_leader(masters, timeout=20)
    status = leader.status()
    assert status is not None and status.term > term
    with master_rpc(leader) as c:
        put(c, node.client_id, "after")
    assert checksums(leader.address, cluster, ["kept", "after", "refused"]) == {
        "kept": checksum("kept"),
        "after": checksum("after"),
    }


def test_standbys_with_data_dirs_keep_the_copy_on_disk_and_lead_from_it_after_a_restart(
    etcd_shared: EtcdServer,
    cluster: str,
    masters: list[HaMaster],
    nodes: list[FakeNode],
    tmp_path: Path,
) -> None:
    def member(name: str) -> HaMaster:
        return HaMaster(etcd_shared.endpoint, cluster, name, "--data-dir", str(tmp_path / name))

    masters.append(member("m1"))
    leader = wait_leader(masters)
    masters.append(member("m2"))
    standby = masters[1]
    node = FakeNode(leader.address, cluster)
    nodes.append(node)
    keys = [f"d{i}" for i in range(300)]
    batch_put(leader, node.client_id, keys)
    wait_until(
        lambda: (s := standby.status()) is not None and s.objects == len(keys),
        10,
        what="the standby's copy",
    )
    leader.proc.kill9()
    standby.proc.kill9()  # both gone: only m2's directory holds the copy
    standby.restart()
    wait_leader([standby], timeout=15)
    node.point(standby.address)
    node.mount()
    found = checksums(standby.address, cluster, keys)
    assert found == {k: checksum(k) for k in keys}


def test_a_deposed_leader_with_a_data_dir_keeps_the_new_leaders_copy_there(
    etcd_shared: EtcdServer,
    cluster: str,
    masters: list[HaMaster],
    nodes: list[FakeNode],
    tmp_path: Path,
) -> None:
    def member(name: str) -> HaMaster:
        return HaMaster(etcd_shared.endpoint, cluster, name, "--data-dir", str(tmp_path / name))

    masters.append(member("m1"))
    old = wait_leader(masters)
    masters.append(member("m2"))
    new = masters[1]
    node = FakeNode(old.address, cluster)
    nodes.append(node)
    batch_put(old, node.client_id, [f"o{i}" for i in range(100)])
    wait_until(lambda: (s := new.status()) is not None and s.objects == 100, 10, what="copy")
    freeze(old.proc.pid)
    try:
        wait_leader([new], timeout=15)
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
    node.point(new.address)
    node.mount()
    batch_put(new, node.client_id, [f"n{i}" for i in range(100)])
    wait_until(
        lambda: (s := old.status()) is not None and s.role == "standby" and s.objects == 200,
        15,
        what="the deposed leader's copy of the new leader",
    )
    new.proc.kill9()
    old.proc.kill9()
    old.restart()  # from its directory alone: the copy it kept as a standby
    wait_leader([old], timeout=15)
    node.point(old.address)
    node.mount()
    keys = [f"o{i}" for i in range(100)] + [f"n{i}" for i in range(100)]
    assert checksums(old.address, cluster, keys) == {k: checksum(k) for k in keys}


def test_a_leader_answers_reads_through_an_etcd_restart_and_leads_again_after_it(
    etcd: EtcdServer, cluster: str, masters: list[HaMaster], nodes: list[FakeNode]
) -> None:
    """etcd killed (a crash, not a freeze: connections refused) and started again on its data a
    few seconds later: the leader and its standby keep answering (reads at the leader), an
    election completes once etcd is back, and the pool takes writes again with every object."""
    masters.append(HaMaster(etcd.endpoint, cluster, "m1"))
    leader = wait_leader(masters)
    masters.append(HaMaster(etcd.endpoint, cluster, "m2"))
    node = FakeNode(leader.address, cluster)
    nodes.append(node)
    with master_rpc(leader) as c:
        put(c, node.client_id, "kept")
    term = leader.status().term  # type: ignore[union-attr]
    etcd.kill()
    try:
        down = time.monotonic()
        with master_rpc(leader) as c:
            while time.monotonic() - down < 5:
                reply = c.call_as(GetReplicaList("kept"), ReplicaListReply)
                assert reply.code == 0 and reply.checksum == checksum("kept")
                time.sleep(0.2)
    finally:
        etcd.start()
    now_leading = wait_leader(masters, timeout=30)
    status = now_leading.status()
    assert status is not None and status.term > term
    node.close()
    node = FakeNode(now_leading.address, cluster)
    nodes.append(node)
    with master_rpc(now_leading) as c:
        put(c, node.client_id, "after")
    assert checksums(now_leading.address, cluster, ["kept", "after"]) == {
        "kept": checksum("kept"),
        "after": checksum("after"),
    }


def test_a_member_that_fell_out_of_sync_never_leads_over_writes_it_lacks(
    etcd_shared: EtcdServer, cluster: str, masters: list[HaMaster], nodes: list[FakeNode]
) -> None:
    """m1 leads, m2 and m3 in sync; m3 stalls and is dropped (the leader records the set
    without it in etcd before it acknowledges without it); 100 puts acknowledged with m2's
    acks; m2 stalls too and m1 dies. m3, alone and awake, must not lead with its stale copy;
    when m2 wakes, m2 leads with every acknowledged put."""
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m1"))
    m1 = wait_leader(masters)
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m2"))
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "m3"))
    m2, m3 = masters[1], masters[2]
    wait_until(
        lambda: (s := m1.status()) is not None and len(s.standbys) == 2,
        15,
        what="both standbys in sync",
    )
    node = FakeNode(m1.address, cluster)
    nodes.append(node)
    first = [f"a{i}" for i in range(50)]
    later = [f"b{i}" for i in range(100)]
    with master_rpc(m1) as c:
        for k in first:
            put(c, node.client_id, k)
    freeze(m3.proc.pid)
    wait_until(
        lambda: (s := m1.status()) is not None and s.standbys == ["m2"],
        10,
        what="m3 dropped, m2 still in sync",
    )
    with master_rpc(m1) as c:
        for k in later:
            put(c, node.client_id, k)  # each acknowledged after m2 has it
    freeze(m2.proc.pid)
    m1.proc.kill9()
    os.kill(m3.proc.pid, signal.SIGCONT)
    # m1's lease (TTL 2 s) has long expired after this; m3 campaigns only if etcd allows it.
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        s = m3.status()
        assert s is None or s.role != "leader", "m3 leads without the writes only m2 has"
        time.sleep(0.2)
    os.kill(m2.proc.pid, signal.SIGCONT)
    leader = wait_leader([m2, m3], timeout=20)
    assert leader is m2
    node.point(m2.address)
    node.mount()
    found = checksums(m2.address, cluster, first + later)
    assert found == {k: checksum(k) for k in first + later}
