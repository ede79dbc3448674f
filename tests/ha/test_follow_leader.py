"""Stores and `kvpool node`s given `etcd://.../CLUSTER` follow the leader key to a new master.

The election is played by the test (`kvtest.leader.publish`): two plain masters A and B of the
cluster, the leader key moved from A (term 1) to B (term 2), A killed. Until `kvpool master --ha`
replicates metadata, B starts empty: what must move is the clients (retarget, remount), not the
objects.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest

from kvpool import Store
from kvpool.errors import ErrorCode
from kvpool.ha import EtcdGateway
from kvpool.protocol.messages import StatsReply
from kvtest.etcd import EtcdServer
from kvtest.leader import master, publish, stats
from kvtest.procs import Proc, kvpool_proc, run_kvpool, wait_until


@pytest.fixture
def masters(cluster: str) -> Iterator[list[tuple[Proc, str]]]:
    started: list[tuple[Proc, str]] = []
    try:
        for name in ("A", "B"):
            started.append(master(cluster, "--client-ttl", "2s", name=f"master-{name}"))
        yield started
    finally:
        for proc, _ in started:
            proc.stop()


def _segments(address: str, cluster: str) -> StatsReply | None:
    reply = stats(address, cluster)
    return reply if reply.segments else None


def test_store_and_node_follow_the_leader_key_to_a_new_master(
    etcd_shared: EtcdServer,
    gateway: EtcdGateway,
    cluster: str,
    masters: list[tuple[Proc, str]],
) -> None:
    (proc_a, a), (_, b) = masters
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    publish(gateway, cluster, a, 1)
    node = kvpool_proc(
        "node",
        "--master",
        url,
        "--segment-size",
        "16MiB",
        "--heartbeat-interval",
        "200ms",
        "--no-progress",
        name="ha-node",
    )
    try:
        node.wait_ready()
        wait_until(lambda: _segments(a, cluster), 10, what="the node's segment at A")
        with Store(url, heartbeat_interval=0.2, failover_timeout=10.0) as store:
            assert store._node.rpc.address == a
            assert store.put("before", b"x" * 1000)
            assert store.get("before") == b"x" * 1000

            t0 = time.monotonic()
            publish(gateway, cluster, b, 2)
            proc_a.kill9()
            # The node remounts at B at once (no NEED_REMOUNT round needed), the Store moves.
            got = wait_until(lambda: _segments(b, cluster), 5, what="the node's segment at B")
            node_moved = time.monotonic() - t0
            wait_until(lambda: store._node.rpc.address == b, 5, what="the Store to move to B")
            assert store.put("after", b"y" * 5000)
            assert store.get("after") == b"y" * 5000
            assert store.put_ex("after-big", b"z" * (1 << 20)).replicas == 1
            assert store.get("after-big") == b"z" * (1 << 20)
            first_put = time.monotonic() - t0
            assert store._node.heartbeat.stats.switches >= 1
            assert len(got.segments) == 1
        print(f"node remounted at B {node_moved:.2f} s, first put at B {first_put:.2f} s")
    finally:
        node.stop()


def test_a_leader_key_with_an_older_term_is_ignored(
    etcd_shared: EtcdServer,
    gateway: EtcdGateway,
    cluster: str,
    masters: list[tuple[Proc, str]],
) -> None:
    (_, a), (_, b) = masters
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    publish(gateway, cluster, a, 5)
    with Store(url, heartbeat_interval=0.2, segment_size="16MiB") as store:
        follower = store._node.follower
        assert follower is not None
        publish(gateway, cluster, b, 3)  # a stale record (a slow etcd member, an old leader)
        view = follower.refresh()
        assert view is not None and (view.address, view.term) == (a, 5)
        assert store._node.rpc.address == a
        assert store._node.rpc.min_term == 5
        assert store.put("k", b"v")
        publish(gateway, cluster, b, 6)  # a real successor is followed
        wait_until(lambda: store._node.rpc.address == b, 5, what="the Store to move to B")
        wait_until(lambda: _segments(b, cluster), 5, what="the Store's segment at B")
        assert store._node.rpc.min_term == 6
        assert store.put("k2", b"v2")
        assert store.get("k2") == b"v2"


def test_status_and_node_accept_an_etcd_master(
    etcd_shared: EtcdServer,
    gateway: EtcdGateway,
    cluster: str,
    masters: list[tuple[Proc, str]],
) -> None:
    (_, a), _ = masters
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    publish(gateway, cluster, a, 1)
    ok = run_kvpool("status", "--master", url, "--json")
    assert ok.returncode == 0, ok.stderr
    assert '"objects"' in ok.stdout
    bad = run_kvpool("status", "--master", url, "--cluster-id", "other")
    assert bad.returncode != 0
    assert "conflicts with the cluster" in bad.stderr


def test_writers_keep_putting_through_a_leader_switch(
    etcd_shared: EtcdServer,
    gateway: EtcdGateway,
    cluster: str,
    masters: list[tuple[Proc, str]],
) -> None:
    """Two writer threads put without pause while the leader moves from A to B and A is killed:
    no put fails (calls in flight are settled or put again, calls after the switch wait for the
    Store's remount at B), and every key acknowledged after the switch reads back exactly."""
    (proc_a, a), (_, b) = masters
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    publish(gateway, cluster, a, 1)
    with Store(url, segment_size="64MiB", heartbeat_interval=0.2, arena_size="1MiB") as store:
        stop = threading.Event()
        errors: list[BaseException] = []
        acked: list[tuple[str, bytes, str]] = []  # (key, value, the master that was leading)

        def writer(tag: str) -> None:
            for i in itertools.count():
                if stop.is_set():
                    return
                key = f"{tag}-{i}"
                value = f"{key}:".encode() * (1 + i % 50)
                try:
                    if store.put(key, value):
                        acked.append((key, value, store._node.rpc.address))
                except BaseException as exc:  # any failure fails the test
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=writer, args=(t,)) for t in ("w0", "w1")]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(acked) > 50, 10, what="puts at A")
            t0 = time.monotonic()
            publish(gateway, cluster, b, 2)
            proc_a.kill9()
            wait_until(lambda: acked[-1][2] == b, 10, what="a put at B")
            first_at_b = time.monotonic() - t0
            at_b = wait_until(
                lambda: sum(1 for x in acked if x[2] == b) > 100, 10, what="puts at B"
            )
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert not errors, errors[:3]
        assert at_b
        print(f"first put at B {first_at_b:.3f} s; calls asked again: {store._node.rpc.retries}")
        late = [(k, v) for k, v, where in acked[-50:] if where == b]
        assert late
        for key, value in late:
            assert store.get(key) == value
        assert stats(b, cluster).objects >= len(late)


def test_without_the_watch_three_failed_pings_find_the_new_leader(
    etcd_shared: EtcdServer,
    gateway: EtcdGateway,
    cluster: str,
    masters: list[tuple[Proc, str]],
) -> None:
    """A pure client (no segment, so no task poll either: any failed call of the Store's own
    would ask etcd too) whose watch is gone finds the new leader by seed 000's rule."""
    (proc_a, a), (_, b) = masters
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    publish(gateway, cluster, a, 1)
    with Store(url, heartbeat_interval=0.1) as store:
        follower = store._node.follower
        assert follower is not None
        follower.discovery.close()  # no watch, no resync: only the heartbeat's rule is left
        publish(gateway, cluster, b, 2)
        proc_a.kill9()
        wait_until(lambda: store._node.heartbeat.stats.switches, 10, what="a switch")
        st = store._node.heartbeat.stats
        assert st.total_failures >= 3
        assert st.reconnects >= 1
        assert store._node.rpc.address == b
        wait_until(
            lambda: any(c.client_id == store.client_id for c in stats(b, cluster).clients),
            5,
            what="the Store registered at B",
        )


@pytest.mark.parametrize("batch", [1, 4])
def test_pure_client_writers_keep_putting_while_nodes_remount(
    etcd_shared: EtcdServer,
    gateway: EtcdGateway,
    cluster: str,
    masters: list[tuple[Proc, str]],
    batch: int,
) -> None:
    """Writers in a Store without a segment put to a `kvpool node`'s memory: after the switch
    the new leader has no segment until the node has remounted, which the Store does not wait
    for; its puts wait for room briefly instead of failing NO_AVAILABLE_HANDLE."""
    (proc_a, a), (_, b) = masters
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    publish(gateway, cluster, a, 1)
    node = kvpool_proc(
        "node",
        "--master",
        url,
        "--segment-size",
        "64MiB",
        "--heartbeat-interval",
        "1s",
        "--no-progress",
        name="ha-node",
    )
    try:
        node.wait_ready()
        with Store(url, heartbeat_interval=0.2, arena_size=0) as store:
            stop = threading.Event()
            errors: list[BaseException] = []
            acked: list[tuple[str, bytes, str]] = []

            def writer(tag: str) -> None:
                for i in itertools.count():
                    if stop.is_set():
                        return
                    keys = [f"{tag}-{i}-{j}" for j in range(batch)]
                    values = [k.encode() * 20 for k in keys]
                    try:
                        if batch == 1:
                            codes = [ErrorCode.OK if store.put(keys[0], values[0]) else -1]
                        else:
                            codes = store.batch_put(keys, values)
                    except BaseException as exc:
                        errors.append(exc)
                        return
                    if any(c != ErrorCode.OK for c in codes):
                        errors.append(AssertionError(f"{keys}: {codes}"))
                        return
                    where = store._node.rpc.address
                    acked.extend((k, v, where) for k, v in zip(keys, values, strict=True))

            threads = [threading.Thread(target=writer, args=(t,)) for t in ("w0", "w1")]
            for t in threads:
                t.start()
            try:
                wait_until(lambda: len(acked) > 50, 10, what="puts at A")
                publish(gateway, cluster, b, 2)
                proc_a.kill9()
                wait_until(lambda: sum(1 for x in acked if x[2] == b) > 50, 10, what="puts at B")
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=30)
            assert not errors, errors[:3]
            for key, value, where in acked[-20:]:
                if where == b:
                    assert store.get(key) == value
    finally:
        node.stop()
