"""Harmless without credentials (issue #15): a master with no auth file refuses to let one
process unmount another's live segment or mount a segment over another's shared memory, and
a remote client may only name its own address as a segment's endpoint."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from kvpool.errors import ErrorCode
from kvpool.master.guard import _endpoint_allowed
from kvpool.protocol import messages as m
from kvpool.rpc import RpcClient
from kvtest.procs import kvpool_proc

E = ErrorCode
MiB = 1 << 20


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def seg(name: str, shm_path: str = "") -> m.SegmentInfo:
    return m.SegmentInfo(m.SegmentName(name), 64 * MiB, m.HostId("h"), "127.0.0.1:1", shm_path)


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    with kvpool_proc("master", "--port", "0") as proc:
        yield proc.wait_ready()


def rpc(address: str) -> RpcClient:
    return RpcClient(address, response_type=m.Response, timeout=10)


def capacity(c: RpcClient) -> int:
    return c.call_as(m.Stats(), m.StatsReply).capacity


def test_another_connection_cannot_unmount_a_live_owners_segment(master: str) -> None:
    owner, name = m.ClientId(_uid("node")), m.SegmentName(_uid("seg"))
    with rpc(master) as node, rpc(master) as attacker:
        assert node.call(m.MountSegment(owner, m.HostId("h"), seg(name))) == m.Reply(0)
        before = capacity(attacker)
        # The owner's id is in Stats (no credentials); naming it is not enough.
        stats = attacker.call_as(m.Stats(), m.StatsReply)
        assert owner in {s.client_id for s in stats.segments}
        assert attacker.call(m.UnmountSegment(owner, name)) == m.Reply(E.ILLEGAL_CLIENT)
        assert capacity(attacker) == before
        assert node.call(m.UnmountSegment(owner, name)) == m.Reply(0)


def test_a_node_that_reconnects_binds_its_new_connection_by_pinging(master: str) -> None:
    owner, name = m.ClientId(_uid("node")), m.SegmentName(_uid("seg"))
    with rpc(master) as first:
        assert first.call(m.ReMountSegment(owner, m.HostId("h"), [seg(name)])).code == 0
    with rpc(master) as second:
        second.call(m.Ping(owner))
        assert second.call(m.UnmountSegment(owner, name)) == m.Reply(0)


def test_a_segment_over_another_clients_shared_memory_is_refused(master: str) -> None:
    owner, thief = m.ClientId(_uid("node")), m.ClientId(_uid("thief"))
    path = f"/dev/shm/{_uid('kvpool-seg')}"
    name = m.SegmentName(_uid("seg"))
    with rpc(master) as node, rpc(master) as attacker:
        assert node.call(m.MountSegment(owner, m.HostId("h"), seg(name, path))) == m.Reply(0)
        before = capacity(attacker)
        fake = seg(_uid("fake"), path)
        assert attacker.call(m.MountSegment(thief, m.HostId("h"), fake)) == m.Reply(
            E.SEGMENT_ALREADY_EXISTS
        )
        remount = attacker.call(m.ReMountSegment(thief, m.HostId("h"), [fake]))
        assert remount.code == E.SEGMENT_ALREADY_EXISTS
        assert capacity(attacker) == before
        # The same /proc path on another host is another process's memory: allowed.
        elsewhere = m.SegmentInfo(fake.name, fake.size, m.HostId("h2"), "127.0.0.1:1", path)
        assert attacker.call(m.MountSegment(thief, m.HostId("h2"), elsewhere)) == m.Reply(0)
        assert attacker.call(m.UnmountSegment(thief, fake.name)) == m.Reply(0)
        assert node.call(m.UnmountSegment(owner, name)) == m.Reply(0)


@pytest.mark.parametrize(
    "endpoint, peer, allowed",
    [
        ("10.0.0.5:7000", "10.0.0.5:40000", True),
        ("10.0.0.6:7000", "10.0.0.5:40000", False),  # a third host
        ("127.0.0.1:7000", "10.0.0.5:40000", False),  # the master's own loopback
        ("node-5:7000", "10.0.0.5:40000", True),  # names are not resolved
        ("10.0.0.6:7000", "127.0.0.1:40000", True),  # a local process
        ("10.0.0.6:7000", "unix", True),
        ("[fd00::6]:7000", "fd00::5:40000", False),
        ("[fd00::5]:7000", "fd00::5:40000", True),
        ("", "10.0.0.5:40000", True),
    ],
)
def test_a_remote_client_names_only_its_own_address_as_an_endpoint(
    endpoint: str, peer: str, allowed: bool
) -> None:
    assert _endpoint_allowed(endpoint, peer) is allowed
