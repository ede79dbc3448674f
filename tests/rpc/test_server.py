"""The server against raw sockets: what a well-behaved client never sends."""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Iterator

import msgspec
import pytest

from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, RpcError, StoreClosed
from kvpool.protocol.framing import ERROR_FLAG, ErrorReply, encode_frame
from kvpool.protocol.handshake import PROTOCOL_VERSION, Hello, Welcome
from kvpool.rpc.client import RpcClient
from kvpool.rpc.server import RpcServer
from kvpool.rpc.thread import ServerThread
from kvtest.procs import wait_until
from rpc.rpc_testkit import (
    CLUSTER,
    Add,
    BadReply,
    Big,
    Finished,
    Gather,
    Kick,
    RawConn,
    Response,
    Said,
    Say,
    Sleep,
    Slept,
    SlowBoom,
    Sum,
    Unknown,
    WhoAmI,
    You,
    make_server,
)

SMALL_LIMIT = 4096


@pytest.fixture
def small_server() -> Iterator[ServerThread]:
    """A server that accepts frames of at most SMALL_LIMIT bytes."""
    st = ServerThread(make_server(max_frame_bytes=SMALL_LIMIT)).start()
    try:
        yield st
    finally:
        st.stop()


def _still_serves(server: ServerThread) -> None:
    with RpcClient(server.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
        assert c.call(Add(20, 22)) == Sum(42)


@pytest.fixture(params=["tcp", "unix"])
def raw_address(request: pytest.FixtureRequest, server: ServerThread) -> str:
    """The test server's TCP endpoint or its abstract Unix socket: both serve the same rules."""
    return server.endpoint if request.param == "tcp" else server.server.unix_address


def test_handshake_welcome(server: ServerThread, raw_address: str) -> None:
    with RawConn(raw_address) as raw:
        welcome = raw.hello()
        assert welcome == Welcome(
            PROTOCOL_VERSION, CLUSTER, server.server.server_name, server.server.unix_address
        )
        assert welcome.unix_address.startswith("\0kvpool-rpc/test-cluster/")
        raw.request(1, Add(1, 2))
        assert raw.recv_reply() == (1, Sum(3))


@pytest.mark.parametrize(
    ("cluster", "version", "code"),
    [
        ("other-cluster", PROTOCOL_VERSION, ErrorCode.ILLEGAL_CLIENT),
        (CLUSTER, PROTOCOL_VERSION + 1, ErrorCode.INVALID_VERSION),
        (CLUSTER, 0, ErrorCode.INVALID_VERSION),
    ],
)
def test_handshake_refusals_answer_then_close(
    server: ServerThread, raw_address: str, cluster: str, version: int, code: ErrorCode
) -> None:
    with RawConn(raw_address) as raw:
        refusal = raw.hello(cluster, version)
        assert isinstance(refusal, ErrorReply)
        assert refusal.code == code
        assert raw.closed_by_peer()
    _still_serves(server)


def test_a_request_before_the_hello_is_refused(server: ServerThread, raw_address: str) -> None:
    with RawConn(raw_address) as raw:
        raw.request(0, Add(1, 1))
        _, reply = raw.recv_reply()
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_PARAMS
        assert raw.closed_by_peer()


def test_a_hello_with_a_nonzero_id_is_refused(server: ServerThread, raw_address: str) -> None:
    with RawConn(raw_address) as raw:
        raw.request(5, Hello(PROTOCOL_VERSION, CLUSTER))
        rid, reply = raw.recv_reply()
        assert rid == 5
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_PARAMS
        assert raw.closed_by_peer()


def test_undecodable_payload_gets_deserialize_fail_and_the_connection_goes_on(
    server: ServerThread,
    raw_address: str,
) -> None:
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.send(encode_frame(7, b"\xc1\xc1\xc1"))  # 0xc1 is never valid msgpack
        rid, reply = raw.recv_reply()
        assert rid == 7
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.DESERIALIZE_FAIL
        raw.request(8, Add(1, 1))
        assert raw.recv_reply() == (8, Sum(2))


@pytest.mark.parametrize(
    "message",
    [Unknown(3), Hello(PROTOCOL_VERSION, CLUSTER), {"a": 1}, [1, 2, 3], "Add", None],
)
def test_valid_msgpack_that_is_no_known_request_gets_invalid_params(
    server: ServerThread, raw_address: str, message: object
) -> None:
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.send(encode_frame(9, msgspec.msgpack.encode(message)))
        rid, reply = raw.recv_reply()
        assert rid == 9
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_PARAMS
        raw.request(10, Add(2, 2))
        assert raw.recv_reply() == (10, Sum(4))


@pytest.mark.parametrize("request_id", [0, ERROR_FLAG | 3])
def test_reserved_request_ids_are_refused(
    server: ServerThread, raw_address: str, request_id: int
) -> None:
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.request(request_id, Add(1, 1))
        _, reply = raw.recv_reply()
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_PARAMS
        raw.request(11, Add(1, 1))
        assert raw.recv_reply() == (11, Sum(2))


def test_oversized_frame_gets_buffer_overflow_then_close_and_others_are_served(
    small_server: ServerThread,
) -> None:
    with RawConn(small_server.endpoint) as raw, RawConn(small_server.endpoint) as bystander:
        raw.hello()
        bystander.hello()
        # Only the header: the server must refuse on the length alone, not wait for the body.
        raw.send(struct.pack("<IQ", SMALL_LIMIT + 1, 77))
        rid, reply = raw.recv_reply()
        assert rid == 77
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.BUFFER_OVERFLOW
        assert raw.closed_by_peer()
        bystander.request(1, Say("x" * 1000))
        assert bystander.recv_reply()[0] == 1
    _still_serves(small_server)


def test_huge_length_prefix_does_not_make_the_server_allocate(
    server: ServerThread, raw_address: str
) -> None:
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.send(struct.pack("<IQ", 0xFFFFFFFF, 1))
        _, reply = raw.recv_reply()
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.BUFFER_OVERFLOW
        assert raw.closed_by_peer()
    _still_serves(server)


def test_too_short_length_prefix_closes_the_connection(
    server: ServerThread, raw_address: str
) -> None:
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.send(struct.pack("<I", 3))
        _, reply = raw.recv_reply()
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_PARAMS
        assert raw.closed_by_peer()
    _still_serves(server)


def test_a_slow_request_does_not_hold_back_later_ones(
    server: ServerThread, raw_address: str
) -> None:
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.send(
            encode_frame(1, msgspec.msgpack.encode(Sleep(0.5, 1)))
            + encode_frame(2, msgspec.msgpack.encode(Add(1, 1)))
        )
        assert raw.recv_reply() == (2, Sum(2))
        assert raw.recv_reply() == (1, Slept(1))


def test_pipelined_requests_in_one_write_are_all_answered(
    server: ServerThread, raw_address: str
) -> None:
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.send(
            b"".join(encode_frame(i, msgspec.msgpack.encode(Add(i, 1))) for i in range(1, 301))
        )
        replies = dict(raw.recv_reply() for _ in range(300))
        assert replies == {i: Sum(i + 1) for i in range(1, 301)}


def test_a_peer_that_never_reads_is_throttled_not_buffered(
    server: ServerThread, raw_address: str
) -> None:
    # Each Say echoes 64 KiB back. Without back-pressure the server would read everything
    # and queue the replies in memory; with it, it stops reading and our sends stall.
    frame = encode_frame(1, msgspec.msgpack.encode(Say("z" * 65536)))
    pushed = 0
    limit = 256 << 20
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.sock.setblocking(False)
        deadline = time.monotonic() + 30
        stalled = False
        while pushed < limit and time.monotonic() < deadline:
            try:
                pushed += raw.sock.send(frame[pushed % len(frame) :])
            except BlockingIOError:
                _, writable, _ = select.select([], [raw.sock], [], 0.5)
                if not writable:
                    stalled = True
                    break
        assert stalled, f"pushed {pushed} bytes without the server pushing back"
        assert pushed < 128 << 20
        _still_serves(server)
    wait_until(lambda: server.server.connection_count == 0, what="throttled peer gone")


def test_server_close_is_idempotent_and_refuses_restart() -> None:
    import asyncio

    from kvpool.rpc.loop import new_event_loop

    async def main() -> None:
        srv = make_server()
        await srv.start()
        await srv.start()  # idempotent
        port = srv.address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        await srv.close()
        await srv.close()
        with pytest.raises(StoreClosed):
            await srv.start()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"port": -1},
        {"port": 70000},
        {"cluster_id": ""},
        {"request_type": int | str | list[int] | list[str]},
        {"max_frame_bytes": 3},
    ],
)
def test_server_arguments_are_validated(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"request_type": Add, "cluster_id": "c"}
    args.update(kwargs)
    with pytest.raises(InvalidParams):
        RpcServer(lambda r, c: r, **args)  # type: ignore[arg-type]


def test_server_address_before_start_is_an_error() -> None:
    with pytest.raises(StoreClosed, match="not started"):
        _ = make_server().address


def test_unencodable_reply_is_serialize_fail(client: RpcClient) -> None:
    with pytest.raises(KVPoolError) as info:
        client.call(BadReply())
    assert info.value.code == ErrorCode.SERIALIZE_FAIL
    assert client.call(Add(1, 1)) == Sum(2)


def test_reply_over_the_frame_limit_is_buffer_overflow(small_server: ServerThread) -> None:
    with RpcClient(small_server.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
        assert c.call(Big(100)) == Said("x" * 100)
        with pytest.raises(InvalidParams) as info:
            c.call(Big(SMALL_LIMIT * 2))
        assert info.value.code == ErrorCode.BUFFER_OVERFLOW
        assert c.call(Add(1, 1)) == Sum(2)


def test_async_handler_exception_is_internal_error(client: RpcClient) -> None:
    with pytest.raises(KVPoolError) as info:
        client.call(SlowBoom(0.01))
    assert info.value.code == ErrorCode.INTERNAL_ERROR
    assert "slow boom" in info.value.message
    assert client.call(Add(1, 1)) == Sum(2)


def test_service_side_close_sends_queued_replies_and_the_client_reconnects(
    server: ServerThread,
) -> None:
    # idle_check_after=0: every call first peeks whether the server closed the connection.
    with RpcClient(
        server.endpoint, response_type=Response, cluster_id=CLUSTER, idle_check_after=0
    ) as c:
        first = c.call(WhoAmI())
        assert c.call(Kick()) == Sum(0)  # the reply leaves before the connection closes
        wait_until(lambda: server.server.connection_count == 0, what="server closed it")
        second = c.call(WhoAmI())  # no failed call: the closed connection is noticed first
        assert isinstance(first, You) and isinstance(second, You)
        assert second.conn_id != first.conn_id


def test_without_the_idle_check_a_closed_connection_fails_one_call(server: ServerThread) -> None:
    with RpcClient(
        server.endpoint, response_type=Response, cluster_id=CLUSTER, idle_check_after=3600
    ) as c:
        assert c.call(Kick()) == Sum(0)
        wait_until(lambda: server.server.connection_count == 0, what="server closed it")
        with pytest.raises(RpcError) as info:
            c.call(WhoAmI())
        assert info.value.code == ErrorCode.RPC_FAIL
        assert isinstance(c.call(WhoAmI()), You)


def test_reply_outside_the_clients_union_is_deserialize_fail(server: ServerThread) -> None:
    with RpcClient(server.endpoint, response_type=Sum, cluster_id=CLUSTER) as c:
        assert c.call(Add(1, 1)) == Sum(2)
        with pytest.raises(KVPoolError) as info:
            c.call(Say("not a Sum"))
        assert info.value.code == ErrorCode.DESERIALIZE_FAIL
        assert c.call(Add(2, 2)) == Sum(4)


@pytest.mark.parametrize("size", [1 << 20, 8 << 20])
def test_large_frames_cross_many_reads(client: RpcClient, size: int) -> None:
    text = "".join(chr(65 + i % 26) for i in range(size))
    assert client.call(Say(text), timeout=30) == Said(text)
    replies = client.call_many([Say(text[: size // 4]), Add(1, 1), Big(size)], timeout=30)
    assert replies == [Said(text[: size // 4]), Sum(2), Said("x" * size)]


def test_a_peer_cannot_park_unbounded_work_on_the_server() -> None:
    # With max_inflight=4, a connection with four Gathers waiting is not read any further:
    # the fifth Gather of the group is never seen, so the group stays incomplete, while
    # another connection is still served. When the group's fifth member arrives on another
    # connection, all five complete and the first connection is read again.
    st = ServerThread(make_server(max_inflight=4)).start()
    try:
        with RawConn(st.endpoint) as raw:
            raw.hello()
            frames = b"".join(
                encode_frame(i, msgspec.msgpack.encode(Gather("inflight", 6, i)))
                for i in range(1, 6)
            )
            raw.send(frames + encode_frame(99, msgspec.msgpack.encode(Add(1, 1))))
            with RpcClient(st.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
                assert c.call(Add(2, 2)) == Sum(4)  # others are served meanwhile
                # Four arrived at the server (the limit), so 4 + this one is not yet 6...
                with pytest.raises(RpcError):
                    c.call(Gather("inflight", 6, 50), timeout=0.3)
                # ...but a second helper completes the group once the fifth is read.
                got = c.call(Gather("inflight", 6, 51), timeout=10)
            assert got == Slept(51)
            replies = dict(raw.recv_reply() for _ in range(6))
            assert replies == {**{i: Slept(i) for i in range(1, 6)}, 99: Sum(2)}
    finally:
        st.stop()


def test_a_client_leaving_does_not_cancel_its_running_request(
    server: ServerThread, raw_address: str
) -> None:
    group = f"orphan-{raw_address}"  # groups outlive a test: one per transport
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.request(1, Gather(group, 2, 1))
        wait_until(lambda: server.server.connection_count == 1, what="connected")
    # This Gather completes the group; the departed client's handler must run to its end too
    # (its reply is dropped), not be cancelled because its connection went away.
    with RpcClient(server.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
        assert c.call(Gather(group, 2, 2), timeout=10) == Slept(2)
        wait_until(lambda: c.call(Finished(group)) == Sum(2), what="both handlers finished")


def test_a_peer_that_half_closes_still_gets_its_slow_replies(
    server: ServerThread, raw_address: str
) -> None:
    with RawConn(raw_address) as raw:
        raw.hello()
        raw.request(1, Sleep(0.2, 1))
        raw.request(2, Add(1, 1))
        raw.sock.shutdown(socket.SHUT_WR)
        assert raw.recv_reply() == (2, Sum(2))
        assert raw.recv_reply() == (1, Slept(1))
        assert raw.closed_by_peer()
    wait_until(lambda: server.server.connection_count == 0, what="closed after the replies")


def test_half_close_with_a_backlog_is_answered_in_full_then_closed() -> None:
    st = ServerThread(make_server(max_inflight=1)).start()
    try:
        with RawConn(st.endpoint) as raw:
            raw.hello()
            raw.request(1, Sleep(0.1, 1))  # fills the in-flight budget of one
            raw.request(2, Add(1, 1))  # waits in the backlog
            raw.request(3, Add(2, 2))
            raw.sock.shutdown(socket.SHUT_WR)
            replies = [raw.recv_reply() for _ in range(3)]
            assert replies == [(1, Slept(1)), (2, Sum(2)), (3, Sum(4))]
            assert raw.closed_by_peer()
    finally:
        st.stop()
