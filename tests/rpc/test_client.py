"""The sync client against a live server: calls, pipelining, timeouts, faults, reconnects."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import psutil
import pytest

from kvpool.errors import (
    ErrorCode,
    IllegalClient,
    InvalidParams,
    KVPoolError,
    NotLeader,
    ObjectNotFound,
    RpcError,
    StoreClosed,
)
from kvpool.protocol.framing import FrameTooLarge
from kvpool.rpc.aio import AsyncRpcClient
from kvpool.rpc.client import RpcClient, parse_address
from kvpool.rpc.thread import ServerThread
from kvtest.procs import Proc, free_port, wait_until
from rpc.rpc_testkit import (
    CLUSTER,
    Add,
    Boom,
    Gather,
    Missing,
    Response,
    Said,
    Say,
    Sleep,
    Slept,
    Sum,
    WhoAmI,
    You,
    make_server,
)

TESTKIT = Path(__file__).with_name("rpc_testkit.py")

# Every test here runs on the Unix socket and again on TCP (the `transport` fixture).
pytestmark = pytest.mark.usefixtures("transport")


def _client(server: ServerThread, **kw: object) -> RpcClient:
    kw.setdefault("cluster_id", CLUSTER)
    return RpcClient(server.endpoint, response_type=Response, **kw)  # type: ignore[arg-type]


def test_call_returns_the_handlers_reply(client: RpcClient) -> None:
    assert client.call(Add(2, 3)) == Sum(5)
    assert client.call(Say("héllo")) == Said("héllo")
    assert client.call_as(Sleep(0.001, 9), Slept) == Slept(9)


def test_handshake_carries_names_both_ways(server: ServerThread, client: RpcClient) -> None:
    you = client.call(WhoAmI())
    assert isinstance(you, You)
    assert you.client_name == "t1"
    assert client.server_name == server.server.server_name


def test_client_of_another_cluster_is_refused_and_disconnected(server: ServerThread) -> None:
    with _client(server, cluster_id="other") as c:
        with pytest.raises(IllegalClient) as info:
            c.call(Add(1, 1))
        assert info.value.code == ErrorCode.ILLEGAL_CLIENT
        assert not c.connected
    wait_until(lambda: server.server.connection_count == 0, what="refused connection closed")


def test_client_of_another_protocol_version_is_refused(server: ServerThread) -> None:
    with _client(server, protocol_version=99) as c, pytest.raises(InvalidParams) as info:
        c.connect()
    assert info.value.code == ErrorCode.INVALID_VERSION


def test_threads_sharing_one_client_each_get_their_own_replies(
    server: ServerThread, client: RpcClient
) -> None:
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for i in range(150):
                if rng.random() < 0.2:
                    token = seed * 1000 + i
                    assert client.call(Sleep(rng.random() * 0.003, token)) == Slept(token)
                else:
                    a, b = rng.randrange(10**6), rng.randrange(10**6)
                    assert client.call(Add(a, b)) == Sum(a + b)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert server.server.connection_count == 1  # all of it on one pipelined connection


def test_concurrent_calls_are_in_flight_together(client: RpcClient) -> None:
    # A Gather of n=6 completes only when six are waiting at the server at once: the calls
    # of six threads must be pipelined on the one connection, not serialized.
    results: list[object] = [None] * 6

    def one(i: int) -> None:
        try:
            results[i] = client.call(Gather("six", 6, i), timeout=10)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert results == [Slept(i) for i in range(6)]


def test_call_many_returns_replies_in_request_order(client: RpcClient) -> None:
    # Sleeps of decreasing length finish at the server in reverse order.
    reqs = [Sleep(0.002 * (20 - i), i) for i in range(20)]
    assert client.call_many(reqs, window=7) == [Slept(i) for i in range(20)]
    assert client.call_many([Gather("many", 5, i) for i in range(5)], window=5) == [
        Slept(i) for i in range(5)
    ]
    assert client.call_many([]) == []


def test_call_many_with_a_failing_request(client: RpcClient) -> None:
    reqs = [Add(1, 1), Missing("k"), Add(2, 2)]
    with pytest.raises(ObjectNotFound):
        client.call_many(reqs)
    out = client.call_many(reqs, return_exceptions=True)
    assert out[0] == Sum(2) and out[2] == Sum(4)
    assert isinstance(out[1], ObjectNotFound)
    assert client.call(Add(3, 3)) == Sum(6)


def test_timeout_raises_rpc_timeout_and_the_late_reply_is_discarded(client: RpcClient) -> None:
    before = client.call(WhoAmI())
    with pytest.raises(RpcError) as info:
        client.call(Sleep(0.3, 1), timeout=0.05)
    assert info.value.code == ErrorCode.RPC_TIMEOUT
    # The late Slept(1) arrives while this call waits for its own reply: it must be dropped.
    assert client.call(Sleep(0.5, 2)) == Slept(2)
    assert client.call(Add(1, 2)) == Sum(3)
    assert client.call(WhoAmI()) == before  # same connection: a timeout is not a fault


def test_follower_timeout_while_another_thread_reads(client: RpcClient) -> None:
    # One thread leads (reads the socket) for a slow call; a second times out as a follower.
    slow_result: list[object] = []
    t = threading.Thread(target=lambda: slow_result.append(client.call(Sleep(0.4, 7))))
    t.start()
    wait_until(lambda: client._conn is not None and client._conn.reading, what="a leader")
    with pytest.raises(RpcError) as info:
        client.call(Sleep(0.3, 8), timeout=0.05)
    assert info.value.code == ErrorCode.RPC_TIMEOUT
    t.join(5)
    assert slow_result == [Slept(7)]
    assert client.call(Add(1, 1)) == Sum(2)


def test_handler_exception_is_an_error_reply_and_the_server_goes_on(client: RpcClient) -> None:
    with pytest.raises(KVPoolError) as info:
        client.call(Boom("kaput"))
    assert info.value.code == ErrorCode.INTERNAL_ERROR
    assert "kaput" in info.value.message
    with pytest.raises(ObjectNotFound):
        client.call(Missing("k"))
    assert client.call(Add(1, 1)) == Sum(2)


def test_request_over_the_frame_limit_is_refused_before_sending(server: ServerThread) -> None:
    with _client(server, max_frame_bytes=1024) as c:
        assert c.call(Add(1, 1)) == Sum(2)
        with pytest.raises(FrameTooLarge):
            c.call(Say("x" * 2000))
        assert c.call(Say("y" * 500)) == Said("y" * 500)


def test_unencodable_request_is_invalid_params(client: RpcClient) -> None:
    with pytest.raises(InvalidParams):
        client.call(object())


def test_server_restart_fails_calls_then_the_client_reconnects(tmp_path: Path) -> None:
    port = free_port()
    args = [sys.executable, str(TESTKIT), "serve", "--port", str(port)]
    with Proc(args, name="rpc-server") as first:
        endpoint = first.wait_ready()
        with RpcClient(endpoint, response_type=Response, cluster_id=CLUSTER, timeout=5) as c:
            conn_before = c.call(WhoAmI())
            first.kill9()
            with pytest.raises(RpcError) as info:
                c.call(Add(1, 1))
            assert info.value.code == ErrorCode.RPC_FAIL
            with pytest.raises(RpcError):  # still down: connecting fails too
                c.call(Add(1, 1))
            with Proc(args, name="rpc-server-2") as second:
                second.wait_ready()
                assert c.call(Add(1, 1)) == Sum(2)
                assert isinstance(conn_before, You)


def test_close_is_idempotent_and_later_calls_raise_store_closed(
    server: ServerThread, client: RpcClient
) -> None:
    assert client.call(Add(1, 1)) == Sum(2)
    client.close()
    client.close()
    with pytest.raises(StoreClosed):
        client.call(Add(1, 1))
    wait_until(lambda: server.server.connection_count == 0, what="server saw the close")


def test_reconnect_replaces_the_connection_and_keeps_the_client_open(
    server: ServerThread, client: RpcClient
) -> None:
    assert client.call(Add(1, 1)) == Sum(2)
    client.reconnect()
    assert not client.closed and not client.connected
    assert client.call(Add(2, 2)) == Sum(4)  # connects anew
    assert client.connected
    client.close()
    assert client.closed
    client.reconnect()  # a no-op once closed
    with pytest.raises(StoreClosed):
        client.call(Add(1, 1))
    wait_until(lambda: server.server.connection_count == 0, what="server saw the close")


def test_close_fails_calls_in_flight(client: RpcClient) -> None:
    out: list[BaseException] = []

    def slow() -> None:
        try:
            client.call(Sleep(5, 1))
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=slow)
    t.start()
    wait_until(lambda: client._conn is not None and client._conn.pending, what="call in flight")
    client.close()
    t.join(5)
    assert not t.is_alive()
    assert len(out) == 1 and isinstance(out[0], RpcError)


def _sockets() -> tuple[int, int]:
    """(TCP, Unix) sockets of this process: clients move to the server's Unix socket."""
    proc = psutil.Process()
    return len(proc.net_connections(kind="tcp")), len(proc.net_connections(kind="unix"))


def test_nothing_is_left_behind_after_close() -> None:
    threads_before = set(threading.enumerate())
    sockets_before = _sockets()
    st = ServerThread(make_server()).start()
    clients = [_client(st) for _ in range(3)]
    for c in clients:
        assert c.call(Add(1, 1)) == Sum(2)
    # A thread that led the reading for others, and a follower, leave nothing behind either.
    workers = [threading.Thread(target=clients[0].call, args=(Sleep(0.01, i),)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(10)

    async def use_async() -> None:
        async with AsyncRpcClient(st.endpoint, response_type=Response, cluster_id=CLUSTER) as a:
            assert await a.call(Add(1, 1)) == Sum(2)

    asyncio.run(use_async())
    assert st.server.connection_count >= 3
    for c in clients:
        c.close()
    wait_until(lambda: st.server.connection_count == 0, what="connections closed")
    server = st.server
    st.stop()
    assert set(threading.enumerate()) == threads_before
    assert server.connection_count == 0
    assert _sockets() == sockets_before  # both listeners and every connection are closed
    st.stop()  # idempotent


def test_server_thread_that_cannot_bind_raises_and_leaves_no_thread(server: ServerThread) -> None:
    before = set(threading.enumerate())
    taken = server.address[1]
    with pytest.raises(OSError):
        ServerThread(make_server(port=taken)).start()
    assert set(threading.enumerate()) == before


def test_server_close_drops_connections_and_clients_see_rpc_fail() -> None:
    st = ServerThread(make_server()).start()
    try:
        with _client(st) as c:
            assert c.call(Add(1, 1)) == Sum(2)
            st.stop()
            assert st.server.connection_count == 0
            with pytest.raises(RpcError):
                c.call(Add(1, 1))
    finally:
        st.stop()


@pytest.mark.parametrize("address", ["", "nohost", "h:0", "h:70000", "h:x", ":80"])
def test_bad_addresses_are_invalid_params(address: str) -> None:
    with pytest.raises(InvalidParams):
        parse_address(address)
    with pytest.raises(InvalidParams):
        RpcClient(address, response_type=Response)


def test_bad_timeout_is_invalid_params() -> None:
    with pytest.raises(InvalidParams):
        RpcClient("127.0.0.1:1", response_type=Response, timeout=0)


def test_connect_to_nothing_is_rpc_fail() -> None:
    with RpcClient(f"127.0.0.1:{free_port()}", response_type=Response) as c:
        with pytest.raises(RpcError) as info:
            c.call(Add(1, 1))
        assert info.value.code == ErrorCode.RPC_FAIL


def test_reading_passes_to_a_caller_still_waiting_not_to_one_already_answered(
    server: ServerThread, client: RpcClient
) -> None:
    # A leads; B and C sleep. The replies of A and B arrive in one read (a Gather group
    # completes them in the same loop iteration, and the server coalesces the write). A must
    # then hand the reading to C, whose reply comes later; handing it to B (answered, about
    # to return) would leave C with no reader until its timeout.
    results: dict[str, object] = {}

    def run(name: str, req: object) -> None:
        try:
            results[name] = client.call(req, timeout=5)
        except BaseException as exc:
            results[name] = exc

    threads = {
        "A": threading.Thread(target=run, args=("A", Gather("handoff", 3, 1))),
        "B": threading.Thread(target=run, args=("B", Gather("handoff", 3, 2))),
        "C": threading.Thread(target=run, args=("C", Sleep(0.5, 3))),
    }
    client.connect()
    conn = client._conn
    assert conn is not None
    threads["A"].start()
    wait_until(lambda: conn.reading, what="A reads")
    threads["B"].start()
    wait_until(lambda: len(conn.sleepers) == 1, what="B sleeps")
    threads["C"].start()
    wait_until(lambda: len(conn.sleepers) == 2, what="C sleeps")
    with _client(server) as other:
        assert other.call(Gather("handoff", 3, 99)) == Slept(99)
    for t in threads.values():
        t.join(10)
    assert results == {"A": Slept(1), "B": Slept(2), "C": Slept(3)}


def _call_in_child(c: RpcClient, out: Connection) -> None:
    out.send(c.call(WhoAmI(), timeout=10))


def test_a_forked_child_connects_anew_and_leaves_the_parents_connection_alone(
    client: RpcClient,
) -> None:
    parent = client.call(WhoAmI())
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_call_in_child, args=(client, sender))
    child.start()
    sender.close()
    try:
        assert receiver.poll(20), "the child got no reply"
        child_you = receiver.recv()
    finally:
        child.join(20)
        receiver.close()
    assert child.exitcode == 0
    assert isinstance(parent, You) and isinstance(child_you, You)
    assert child_you.conn_id != parent.conn_id  # the child made its own connection
    assert client.call(WhoAmI()) == parent  # and the parent's is untouched


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), "5"])
def test_a_call_timeout_must_be_positive(client: RpcClient, timeout: object) -> None:
    with pytest.raises(InvalidParams):
        client.call(Add(1, 1), timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        client.call_many([Add(1, 1)], timeout=timeout)  # type: ignore[arg-type]
    assert client.call(Add(1, 1)) == Sum(2)


def test_welcome_carries_the_leader_term_and_an_older_term_is_refused(
    server: ServerThread,
) -> None:
    term = [7]
    server.server.term = lambda: term[0]
    with _client(server) as c:
        c.connect()
        assert (c.server_term, c.min_term) == (7, 7)
        assert c.call(Add(1, 1)) == Sum(2)
        # The server now answers as an older leader (a deposed one, restarted on its port):
        # the client that saw term 7 refuses it and sends nothing.
        term[0] = 6
        c.reconnect()
        with pytest.raises(NotLeader) as err:
            c.call(Add(1, 1))
        assert err.value.code == ErrorCode.NOT_LEADER
        term[0] = 8
        assert c.call(Add(2, 2)) == Sum(4)
        assert c.min_term == 8
    server.server.term = None
    with _client(server) as c:  # not HA: term 0, never refused
        c.min_term = 9
        assert c.call(Add(1, 2)) == Sum(3)
        assert c.server_term == 0


def test_retarget_moves_the_same_client_to_another_server() -> None:
    first = ServerThread(make_server()).start()
    second = ServerThread(make_server()).start()
    try:
        client = _client(first)
        try:
            assert client.call(Add(1, 1)) == Sum(2)
            got: list[BaseException] = []

            def sleeper() -> None:
                try:
                    client.call(Sleep(5.0, 1), timeout=10.0)
                except BaseException as exc:
                    got.append(exc)

            thread = threading.Thread(target=sleeper)
            thread.start()
            wait_until(lambda: client.connected, 5, what="a connection")
            assert client.retarget(second.endpoint) is True
            thread.join(timeout=5)
            assert got and isinstance(got[0], RpcError)  # in flight on the old connection
            assert client.address == second.endpoint
            assert client.call(Add(2, 2)) == Sum(4)
            assert client.retarget(second.endpoint) is False  # the same address: nothing
            with pytest.raises(InvalidParams):
                client.retarget("no-port")
        finally:
            client.close()
        assert client.retarget(first.endpoint) is False  # closed
    finally:
        first.stop()
        second.stop()


def test_async_retarget_moves_the_same_client_to_another_server() -> None:
    first = ServerThread(make_server()).start()
    second = ServerThread(make_server()).start()

    async def main() -> None:
        async with AsyncRpcClient(
            first.endpoint, response_type=Response, cluster_id=CLUSTER
        ) as client:
            assert await client.call(Add(1, 1)) == Sum(2)
            assert client.retarget(second.endpoint) is True
            assert client.address == second.endpoint
            assert await client.call(Add(2, 2)) == Sum(4)

    try:
        asyncio.run(main())
    finally:
        first.stop()
        second.stop()
