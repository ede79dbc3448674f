"""Same-host clients move to the server's abstract Unix socket; TCP whenever that cannot be.

Real servers on loopback: the test service (`rpc_testkit`), variants of it that advertise a
socket they do not serve (subclasses overriding what the Welcome names), and the testkit in a
child process for restarts.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import sys
import threading
from collections.abc import Coroutine, Iterator
from multiprocessing.connection import Connection as PipeEnd
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from kvpool.errors import ErrorCode, RpcError
from kvpool.rpc.aio import AsyncRpcClient
from kvpool.rpc.client import RpcClient
from kvpool.rpc.loop import new_event_loop
from kvpool.rpc.server import RpcServer
from kvpool.rpc.thread import ServerThread
from kvtest.procs import Proc, free_port, wait_until
from rpc.rpc_testkit import (
    CLUSTER,
    Add,
    Big,
    Boom,
    Kick,
    Missing,
    Request,
    Response,
    Say,
    Sleep,
    WhoAmI,
    You,
    handler,
    make_server,
)

T = TypeVar("T")
TESTKIT = Path(__file__).with_name("rpc_testkit.py")

# A mix of replies, error replies and a reply spanning many reads.
REQUESTS: list[Any] = [
    Add(2, 3),
    Say("héllo"),
    Sleep(0.001, 4),
    Big(200_000),
    Missing("k"),
    Boom("x"),
]


def run(coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


def _sync(address: str, **kw: Any) -> RpcClient:
    kw.setdefault("cluster_id", CLUSTER)
    return RpcClient(address, response_type=Response, **kw)


def _async(address: str, **kw: Any) -> AsyncRpcClient:
    kw.setdefault("cluster_id", CLUSTER)
    return AsyncRpcClient(address, response_type=Response, **kw)


def _outcome(exc: BaseException | None, value: Any) -> Any:
    """A reply, or (exception type, code) for an error reply, comparable across clients."""
    if exc is not None:
        return (type(exc), getattr(exc, "code", None))
    return value


def _sync_outcomes(c: RpcClient) -> list[Any]:
    out = c.call_many(REQUESTS, return_exceptions=True)
    return [_outcome(r, None) if isinstance(r, BaseException) else r for r in out]


async def _async_outcomes(c: AsyncRpcClient) -> list[Any]:
    out = await c.call_many(REQUESTS, return_exceptions=True)
    return [_outcome(r, None) if isinstance(r, BaseException) else r for r in out]


def _transports(server: ServerThread, **kw: Any) -> tuple[str | None, str | None]:
    """(sync, async) transport of a client of `server` after one call."""
    with _sync(server.endpoint, **kw) as c:
        assert c.call(Add(1, 1)) is not None
        sync = c.transport

    async def main() -> str | None:
        async with _async(server.endpoint, **kw) as a:
            assert await a.call(Add(1, 1)) is not None
            return a.transport

    return sync, run(main())


class AdvertisingServer(RpcServer):
    """The test service, but its Welcome names `advertised` instead of its own Unix socket."""

    def __init__(self, advertised: str, **kw: Any) -> None:
        super().__init__(handler, request_type=Request, cluster_id=CLUSTER, **kw)
        self.advertised = advertised

    @property
    def unix_address(self) -> str:
        return self.advertised

    @property
    def real_unix_address(self) -> str:
        """The socket this server does listen on."""
        return RpcServer.unix_address.fget(self)  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def silent_unix() -> Iterator[str]:
    """An abstract socket that listens (connects succeed) but never accepts nor answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0kvpool-test/silent/{id(sock)}"
    sock.bind(name)
    sock.listen(8)
    try:
        yield name
    finally:
        sock.close()


# ---------------------------------------------------------------- which transport


def test_sync_and_async_clients_use_unix_on_the_same_host_and_get_the_same_replies(
    server: ServerThread,
) -> None:
    assert server.server.unix_address.startswith("\0kvpool-rpc/")
    with _sync(server.endpoint, unix=False) as tcp, _sync(server.endpoint) as unix:
        assert unix.transport is None  # not connected yet
        expected = _sync_outcomes(tcp)
        assert tcp.transport == "tcp"
        assert _sync_outcomes(unix) == expected
        assert unix.transport == "unix"
        # The TCP connection the unix client handshook on is gone; its calls run over unix.
        wait_until(lambda: server.server.connection_count == 2, what="bootstrap TCP closed")
        assert sorted(c.peer == "unix" for c in server.server.connections()) == [False, True]

    async def main() -> None:
        async with _async(server.endpoint) as a:
            assert await _async_outcomes(a) == expected
            assert a.transport == "unix"
            you = await a.call(WhoAmI())
            assert isinstance(you, You)

    run(main())


def test_a_server_with_unix_off_keeps_clients_on_tcp() -> None:
    with ServerThread(make_server(unix=False)) as st:
        assert st.server.unix_address == ""
        assert _transports(st) == ("tcp", "tcp")


def test_a_client_with_unix_off_stays_on_tcp(server: ServerThread) -> None:
    assert _transports(server, unix=False) == ("tcp", "tcp")


def test_kvpool_rpc_unix_0_keeps_every_client_on_tcp(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVPOOL_RPC_UNIX", "0")
    assert _transports(server) == ("tcp", "tcp")
    monkeypatch.setenv("KVPOOL_RPC_UNIX", "1")
    assert _transports(server) == ("unix", "unix")


@pytest.mark.parametrize(
    "advertised",
    [
        "\0kvpool-rpc/test-cluster/1/no-such-socket",  # another host: ECONNREFUSED
        "/tmp/kvpool-not-abstract.sock",  # a path: never followed
        "\0",  # an empty abstract name
        "\0" + "x" * 200,  # longer than sun_path
    ],
)
def test_an_advertised_socket_that_cannot_be_used_leaves_the_client_on_tcp(
    advertised: str,
) -> None:
    with ServerThread(AdvertisingServer(advertised)) as st:
        assert _transports(st) == ("tcp", "tcp")
        with _sync(st.endpoint) as c, _sync(st.endpoint, unix=False) as tcp:
            assert _sync_outcomes(c) == _sync_outcomes(tcp)


def test_a_unix_socket_whose_server_names_another_address_is_not_used() -> None:
    # `other` listens on a Unix socket but its Welcome names a different one; `st` sends
    # clients to `other`'s socket. The second handshake succeeds (same cluster), so only the
    # address check keeps the client from using it.
    with (
        ServerThread(AdvertisingServer("\0kvpool-test/elsewhere")) as other,
        ServerThread(AdvertisingServer(other.server.real_unix_address)) as st,
    ):
        assert other.server.real_unix_address
        assert _transports(st) == ("tcp", "tcp")
        wait_until(lambda: other.server.connection_count == 0, what="probe connections closed")


def test_a_unix_socket_of_another_cluster_is_refused_and_tcp_serves() -> None:
    with (
        ServerThread(make_server(cluster_id="another-cluster")) as other,
        ServerThread(AdvertisingServer(other.server.unix_address)) as st,
    ):
        assert _transports(st) == ("tcp", "tcp")


def test_a_unix_socket_that_never_answers_costs_half_the_budget_then_tcp_serves(
    silent_unix: str,
) -> None:
    with ServerThread(AdvertisingServer(silent_unix)) as st:
        assert _transports(st, timeout=4.0) == ("tcp", "tcp")


def test_a_server_whose_unix_bind_fails_serves_tcp_alone() -> None:
    taken = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    taken.bind(f"\0kvpool-test/taken/{id(taken)}")
    name = taken.getsockname().decode()

    class Clashing(RpcServer):
        def _new_unix_name(self) -> str:
            return name

    try:
        with ServerThread(Clashing(handler, request_type=Request, cluster_id=CLUSTER)) as st:
            assert st.server.unix_address == ""
            assert _transports(st) == ("tcp", "tcp")
    finally:
        taken.close()


def test_server_close_closes_the_unix_listener() -> None:
    st = ServerThread(make_server()).start()
    name = st.server.unix_address
    with _sync(st.endpoint) as c:
        assert c.call(Add(1, 1)) is not None and c.transport == "unix"
        st.stop()
    assert st.server.unix_address == ""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with probe, pytest.raises(ConnectionRefusedError):
        probe.connect(name)


# ---------------------------------------------------------------- faults and reconnects


def test_a_service_side_close_fails_nothing_idle_and_the_client_comes_back_over_unix(
    server: ServerThread,
) -> None:
    with _sync(server.endpoint, idle_check_after=0) as c:
        first = c.call(WhoAmI())
        assert c.transport == "unix"
        c.call(Kick())  # the service closes this (unix) connection after replying
        wait_until(lambda: server.server.connection_count == 0, what="kicked")
        again = c.call(WhoAmI())
        assert isinstance(first, You) and isinstance(again, You)
        assert again.conn_id != first.conn_id
        assert c.transport == "unix"


def test_server_restart_fails_the_call_in_flight_then_the_client_reconnects_over_unix() -> None:
    port = free_port()
    args = [sys.executable, str(TESTKIT), "serve", "--port", str(port)]
    with Proc(args, name="rpc-server") as first:
        endpoint = first.wait_ready()
        with RpcClient(endpoint, response_type=Response, cluster_id=CLUSTER, timeout=10) as c:
            assert c.call(Add(1, 1)) is not None and c.transport == "unix"
            outcome: list[BaseException | object] = []

            def slow() -> None:
                try:
                    outcome.append(c.call(Sleep(30, 1)))
                except BaseException as exc:
                    outcome.append(exc)

            t = threading.Thread(target=slow)
            t.start()
            wait_until(lambda: c._conn is not None and bool(c._conn.pending), what="in flight")
            first.kill9()
            t.join(10)
            assert len(outcome) == 1 and isinstance(outcome[0], RpcError)
            assert outcome[0].code == ErrorCode.RPC_FAIL
            assert c.transport is None
            with Proc(args, name="rpc-server-2") as second:
                second.wait_ready()
                assert c.call(Add(2, 2)) is not None
                assert c.transport == "unix"  # the new server's socket, learnt over TCP


def test_async_client_reconnects_over_unix_after_a_restart_on_the_same_port() -> None:
    port = free_port()
    st = ServerThread(make_server(port)).start()
    try:

        async def main() -> None:
            nonlocal st
            async with _async(st.endpoint) as c:
                assert await c.call(Add(1, 1)) is not None
                assert c.transport == "unix"
                pending = asyncio.ensure_future(c.call(Sleep(30, 1)))
                deadline = asyncio.get_running_loop().time() + 10
                while not (c._proto is not None and c._proto.pending):  # sent, not answered
                    assert asyncio.get_running_loop().time() < deadline, "never in flight"
                    await asyncio.sleep(0.001)
                old_name = st.server.unix_address
                await asyncio.to_thread(st.stop)
                with pytest.raises(RpcError) as info:
                    await pending
                assert info.value.code == ErrorCode.RPC_FAIL
                st = ServerThread(make_server(port)).start()
                assert st.server.unix_address != old_name
                assert await c.call(Add(2, 2)) is not None
                assert c.transport == "unix"
                # The TCP connection it handshook on closes (the server sees it a bit later).
                deadline = asyncio.get_running_loop().time() + 10
                while [conn.peer for conn in st.server.connections()] != ["unix"]:
                    assert asyncio.get_running_loop().time() < deadline, st.server.connections()
                    await asyncio.sleep(0.001)

        run(main())
    finally:
        st.stop()


def test_a_timeout_over_unix_is_rpc_timeout_and_keeps_the_connection(
    server: ServerThread,
) -> None:
    with _sync(server.endpoint) as c:
        before = c.call(WhoAmI())
        with pytest.raises(RpcError) as info:
            c.call(Sleep(0.3, 1), timeout=0.05)
        assert info.value.code == ErrorCode.RPC_TIMEOUT
        assert c.call(WhoAmI()) == before
        assert c.transport == "unix"


# ---------------------------------------------------------------- fork


def _child(c: RpcClient, out: PipeEnd) -> None:
    you = c.call(WhoAmI(), timeout=10)
    out.send((you, c.transport))


def test_a_client_made_before_fork_uses_unix_in_parent_and_child(server: ServerThread) -> None:
    with _sync(server.endpoint) as c:
        parent = c.call(WhoAmI())
        assert c.transport == "unix"
        ctx = multiprocessing.get_context("fork")
        receiver, sender = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child, args=(c, sender))
        child.start()
        sender.close()
        try:
            assert receiver.poll(20), "the child got no reply"
            child_you, child_transport = receiver.recv()
        finally:
            child.join(20)
            receiver.close()
        assert child.exitcode == 0
        assert child_transport == "unix"
        assert isinstance(child_you, You) and isinstance(parent, You)
        assert child_you.conn_id != parent.conn_id
        assert c.call(WhoAmI()) == parent and c.transport == "unix"


# ---------------------------------------------------------------- nothing left behind


def _sockets() -> tuple[int, int]:
    proc = psutil.Process()
    return len(proc.net_connections(kind="tcp")), len(proc.net_connections(kind="unix"))


def test_unix_clients_and_listener_leave_no_socket_or_thread_behind() -> None:
    threads_before = set(threading.enumerate())
    before = _sockets()
    st = ServerThread(make_server()).start()
    clients = [_sync(st.endpoint) for _ in range(3)]
    for c in clients:
        assert c.call(Add(1, 1)) is not None and c.transport == "unix"

    async def use_async() -> None:
        async with _async(st.endpoint) as a:
            assert await a.call(Add(1, 1)) is not None and a.transport == "unix"

    run(use_async())
    for c in clients:
        c.close()
    wait_until(lambda: st.server.connection_count == 0, what="connections closed")
    st.stop()
    assert set(threading.enumerate()) == threads_before
    wait_until(lambda: _sockets() == before, what="every tcp and unix socket closed")


def test_call_many_of_large_requests_over_unix_does_not_stall(server: ServerThread) -> None:
    """128 requests of 8 KB echoed back: more than a Unix socket's buffers hold in one burst.
    The client must read replies between bursts, or it blocks in sendall while the server,
    its replies unread, has stopped reading (review finding; TCP's larger buffers hid it)."""
    with _sync(server.endpoint, timeout=5.0) as c:
        c.connect()
        assert c.transport == "unix"
        replies = c.call_many([Say("x" * 8000) for _ in range(128)], window=128)
        assert [r.text for r in replies] == ["x" * 8000] * 128


def test_no_unix_socket_to_be_had_leaves_both_clients_on_tcp(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE when making the Unix socket (the process is out of descriptors; cannot be caused
    safely in the test process, so socket() is made to fail for AF_UNIX only): the call is
    served over the TCP connection already made, never failed with a raw OSError."""
    import errno

    real = socket.socket

    class NoUnix(real):  # type: ignore[misc, valid-type]
        def __init__(self, family: int = -1, *a: Any, **kw: Any) -> None:
            # Only the RPC clients' own Unix sockets: event loops need theirs.
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if family == socket.AF_UNIX and caller.startswith("kvpool.rpc"):
                raise OSError(errno.EMFILE, "Too many open files")
            super().__init__(family, *a, **kw)

    monkeypatch.setattr(socket, "socket", NoUnix)
    with _sync(server.endpoint, timeout=5.0) as c:
        assert c.call(Say("x")).text == "x" and c.transport == "tcp"

    async def one() -> tuple[str, str | None]:
        async with _async(server.endpoint, timeout=5.0) as a:
            reply = await a.call(Say("y"))
            return reply.text, a.transport

    assert run(one()) == ("y", "tcp")
