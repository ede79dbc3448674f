"""`Store.mount_segment` / `unmount_segment` / `segments`: capacity added and taken away while a
Store runs, against real `kvpool master` and `kvpool node` processes on loopback.

A second Store in the test process with `protocol="tcp"` reads through the owner's transfer
server, so "served" is checked over the wire, not only through shared memory.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kvpool.client import ReplicateConfig, Store
from kvpool.errors import ErrorCode, InvalidParams, ObjectNotFound, SegmentError, StoreClosed
from kvpool.protocol.messages import (
    GetReplicaList,
    ReplicaListReply,
    Response,
    Stats,
    StatsReply,
)
from kvpool.rpc.client import RpcClient
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.procs import free_port, kvpool_proc, wait_until


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="16MiB")


def segments_at(address: str) -> set[str]:
    with RpcClient(address, response_type=Response) as rpc:
        return {s.name for s in rpc.call_as(Stats(), StatsReply).segments}


def replica_segments(address: str, key: str) -> list[str]:
    with RpcClient(address, response_type=Response) as rpc:
        return [r.segment for r in rpc.call_as(GetReplicaList(key), ReplicaListReply).replicas]


def on(segment: str) -> ReplicateConfig:
    return ReplicateConfig(preferred_segments=[segment])


def test_a_pure_client_mounts_a_segment_that_takes_puts_and_serves_other_clients(
    one_node: Pool,
) -> None:
    with (
        Store(one_node.address) as own,
        Store(one_node.address, protocol="tcp") as reader,
    ):
        assert own.segments == []
        seg = own.mount_segment("4MiB")
        assert own.segments == [seg]
        assert seg in segments_at(one_node.address)
        value = bytes(range(256)) * 300
        reader.put("mounted-later", value, on(seg))  # written over TCP to own's server
        assert replica_segments(one_node.address, "mounted-later") == [seg]
        assert own.get("mounted-later") == value  # a memcpy from its own segment
        assert reader.get("mounted-later") == value  # read back over TCP
        own.remove("mounted-later", force=True)


def test_segments_mounted_later_share_the_transfer_server_and_never_reuse_a_name(
    one_node: Pool,
) -> None:
    with Store(one_node.address, segment_size="4MiB") as own:
        (first,) = own.segments
        second = own.mount_segment(1 << 20)
        own.unmount_segment(second)
        third = own.mount_segment("1MiB")
        endpoint = first.rpartition("/")[0]
        assert second.rpartition("/")[0] == endpoint == third.rpartition("/")[0]
        assert len({first, second, third}) == 3
        assert own.segments == [first, third]
        assert {first, third} <= segments_at(one_node.address)
        assert second not in segments_at(one_node.address)


def test_unmount_drops_the_replicas_the_segment_held(one_node: Pool) -> None:
    with Store(one_node.address) as own, Store(one_node.address, protocol="tcp") as other:
        kept = own.mount_segment("2MiB")
        gone = own.mount_segment("2MiB")
        other.put("only-on-gone", b"g" * 5000, on(gone))
        other.put("on-kept", b"k" * 5000, on(kept))
        both = ReplicateConfig(replica_num=2, preferred_segments=[gone, kept])
        other.put("on-both", b"b" * 5000, both)
        assert set(replica_segments(one_node.address, "on-both")) == {gone, kept}

        own.unmount_segment(gone)

        assert own.segments == [kept]
        assert gone not in segments_at(one_node.address)
        with pytest.raises(ObjectNotFound):
            other.get("only-on-gone")
        assert other.get("on-kept") == b"k" * 5000
        assert other.get("on-both") == b"b" * 5000  # served by the replica left
        assert replica_segments(one_node.address, "on-both") == [kept]
        other.remove_all(force=True)


def test_unmount_of_a_segment_this_store_does_not_own_is_segment_not_found(
    one_node: Pool,
) -> None:
    node_segment = one_node.node_endpoints[0] + "/0"
    with Store(one_node.address) as s:
        seg = s.mount_segment("1MiB")
        for name in (node_segment, seg + "x", "nonsense"):
            with pytest.raises(SegmentError) as info:
                s.unmount_segment(name)
            assert info.value.code == ErrorCode.SEGMENT_NOT_FOUND
        s.unmount_segment(seg)
        with pytest.raises(SegmentError):
            s.unmount_segment(seg)  # twice
        with pytest.raises(InvalidParams):
            s.unmount_segment(3)  # type: ignore[arg-type]
    assert node_segment in segments_at(one_node.address)  # the node's segment untouched


@pytest.mark.parametrize("size", [0, -1, 100, 4095, "lots", "", True, 1.5, None])
def test_bad_sizes_are_invalid_params_and_mount_nothing(one_node: Pool, size: object) -> None:
    before = segments_at(one_node.address)
    with Store(one_node.address) as s:
        with pytest.raises(InvalidParams):
            s.mount_segment(size)  # type: ignore[arg-type]
        assert s.segments == []
        assert segments_at(one_node.address) == before


def test_close_unmounts_and_frees_every_segment_and_stops_its_threads(one_node: Pool) -> None:
    threads_before = set(threading.enumerate())
    s = Store(one_node.address, segment_size="2MiB")
    names = [*s.segments, s.mount_segment("1MiB"), s.mount_segment("1MiB")]
    mems = [s._node.segments[n][0] for n in names]  # type: ignore[index]  # the memory it owns
    assert set(names) <= segments_at(one_node.address)
    s.close()
    assert not set(names) & segments_at(one_node.address)
    assert all(m.closed for m in mems)
    assert s.segments == []
    wait_until(
        lambda: set(threading.enumerate()) <= threads_before,
        timeout=10,
        what="the Store's threads (heartbeat, server, task executor) to end",
    )
    with pytest.raises(StoreClosed):
        s.mount_segment("1MiB")
    with pytest.raises(StoreClosed):
        s.unmount_segment(names[0])


def test_a_restarted_master_gets_mounted_segments_back() -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    master = kvpool_proc("master", "--port", str(port), name="master 1")
    try:
        master.wait_ready()
        with Store(address, heartbeat_interval=0.1) as s:
            segs = {s.mount_segment("1MiB"), s.mount_segment("1MiB")}
            master.kill9()
            master = kvpool_proc("master", "--port", str(port), name="master 2")
            master.wait_ready()
            wait_until(
                lambda: segments_at(address) == segs,
                timeout=20,
                what="the store to remount the segments it mounted later",
            )
            (seg, *_) = segs
            assert s.put("after-restart", b"again", on(seg))
            assert replica_segments(address, "after-restart") == [seg]
            assert s.get("after-restart") == b"again"
    finally:
        master.stop()


def test_a_segment_over_a_file_stores_values_in_that_file(one_node: Pool, tmp_path: Path) -> None:
    path = tmp_path / "segment.bin"
    path.write_bytes(b"\xee" * (3 << 20))
    with Store(one_node.address) as own, Store(one_node.address) as other:
        seg = own.mount_segment("1MiB", path=str(path), offset=1 << 20)
        value = bytes(range(251)) * 40
        other.put("in-file", value, on(seg))  # same host, no memfd to map: over TCP
        with RpcClient(one_node.address, response_type=Response) as rpc:
            (r,) = rpc.call_as(GetReplicaList("in-file"), ReplicaListReply).replicas
        assert r.segment == seg
        with path.open("rb") as f:
            f.seek((1 << 20) + r.offset)
            assert f.read(len(value)) == value  # the bytes live in the caller's file
        assert other.get("in-file") == value
        assert own.get("in-file") == value
        own.unmount_segment(seg)
        with pytest.raises(ObjectNotFound):
            other.get("in-file")
    assert path.stat().st_size == 3 << 20  # the file is the caller's: left as it is


def test_a_file_segment_refuses_bad_paths_and_ranges(one_node: Pool, tmp_path: Path) -> None:
    path = tmp_path / "small.bin"
    path.write_bytes(bytes(1 << 20))
    cases: list[tuple[str, int, int]] = [
        (str(tmp_path / "missing"), 1 << 20, 0),
        (str(tmp_path), 1 << 20, 0),  # a directory
        (str(path), 2 << 20, 0),  # past the end
        (str(path), 1 << 20, 4096),  # past the end from the offset
        (str(path), 4096, 100),  # offset not page-aligned
        (str(path), 4096, -4096),
    ]
    before = segments_at(one_node.address)
    with Store(one_node.address) as s:
        for file, size, offset in cases:
            with pytest.raises(InvalidParams):
                s.mount_segment(size, path=file, offset=offset)
        assert s.segments == []
        assert segments_at(one_node.address) == before
