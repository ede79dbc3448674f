"""NodeRuntime and its heartbeat against a real master that the tests stop and restart."""

from __future__ import annotations

import pytest

from kvpool.client.node import NodeRuntime
from kvpool.errors import InvalidParams, SegmentError, StoreClosed
from kvpool.protocol.messages import Response, SegmentName, Stats, StatsReply
from kvpool.rpc.client import RpcClient
from kvtest.procs import Proc, free_port, kvpool_proc, wait_until


def segments_at(address: str) -> set[str]:
    with RpcClient(address, response_type=Response) as rpc:
        return {s.name for s in rpc.call_as(Stats(), StatsReply).segments}


def stats_at(address: str) -> StatsReply:
    with RpcClient(address, response_type=Response) as rpc:
        return rpc.call_as(Stats(), StatsReply)


def start_master(port: int) -> Proc:
    proc = kvpool_proc("master", "--port", str(port), name="master")
    proc.wait_ready()
    return proc


def test_mount_and_unmount_show_at_the_master_and_close_is_idempotent() -> None:
    port = free_port()
    master = start_master(port)
    address = f"127.0.0.1:{port}"
    try:
        node = NodeRuntime(address, heartbeat_interval=0.1).start()
        try:
            mem = node.mount("2MiB")
            assert mem.name in segments_at(address)
            assert node.endpoint is not None and mem.name.startswith(node.endpoint)
            node.unmount(SegmentName(mem.name))
            assert segments_at(address) == set()
            assert mem.closed
            with pytest.raises(SegmentError):
                node.unmount(SegmentName(mem.name))
            with pytest.raises(InvalidParams):
                node.mount(100)  # below one page
            node.mount("1MiB")
        finally:
            node.close()
            node.close()
        assert segments_at(address) == set()  # close() unmounted what was left
        with pytest.raises(StoreClosed):
            node.mount("1MiB")
    finally:
        master.stop()


def test_heartbeat_backs_off_reconnects_and_remounts_after_a_master_restart() -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    master = start_master(port)
    # Not started: the test drives the heartbeat by hand, one beat at a time.
    node = NodeRuntime(address, heartbeat_interval=0.5, rpc_timeout=1)
    try:
        node.remount()
        mem = node.mount("1MiB")
        hb = node.heartbeat
        assert hb.beat() == 0.5 and hb.stats.pings == 1
        master.kill9()
        delays = [hb.beat() for _ in range(7)]
        # The third failure reconnects; from then on every failed beat reconnects and the delay
        # doubles up to max_backoff (8 s).
        assert delays == [0.5, 0.5, 0.5, 1.0, 2.0, 4.0, 8.0]
        assert hb.stats.failures == 7 and hb.stats.reconnects == 5
        master = start_master(port)
        assert hb.beat() == 0.5  # answered NEED_REMOUNT: remounted
        assert hb.stats.failures == 0 and hb.stats.remounts == 1
        assert mem.name in segments_at(address)
        hb.beat()
        assert hb.stats.remounts == 1  # the master knows us again: nothing more to do
    finally:
        node.close()
        master.stop()


def test_a_node_silent_past_client_ttl_remounts_its_segment_with_its_objects() -> None:
    """After a pause longer than client_ttl the master holds the node as silent; the next beat
    answers NEED_REMOUNT and the remount, naming the same memory (name and generation), gets
    the segment back with what it held (`restored`), not a fresh one."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    master = kvpool_proc(
        "master", "--port", str(port), "--client-ttl", "1s", "--client-dead-ttl", "60s"
    )
    master.wait_ready()
    node = NodeRuntime(address, heartbeat_interval=0.2)  # beats driven by hand: a "pause"
    try:
        node.remount()
        mem = node.mount("1MiB")
        (info,) = (i for _, i in node.segments.values())
        assert info.generation != 0
        wait_until(
            lambda: mem.name in {s.name for s in stats_at(address).silent_segments},
            timeout=20,
            what="the master to hold the paused node as silent",
        )
        assert node.heartbeat.beat() == 0.2  # NEED_REMOUNT, then the remount
        assert node.heartbeat.stats.remounts == 1
        assert node.restored == [mem.name]
        assert mem.name in segments_at(address) and not stats_at(address).silent_segments
    finally:
        node.close()
        master.stop()
