"""What `kvpool bench fuzz` found on the control plane, one test per finding.

Each is marked xfail (strict) while its fix, in code another change owns, is pending; the
reason names the fix.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import psutil
import pytest

from kvpool.bench.fuzz_input import connect_many
from kvpool.errors import ErrorCode
from kvpool.protocol import messages as m
from kvpool.protocol.framing import encode_frame
from kvpool.protocol.handshake import PROTOCOL_VERSION, Hello
from kvpool.rpc.client import RpcClient
from kvpool.rpc.thread import ServerThread
from kvtest.procs import freeze, kvpool_proc
from rpc.rpc_testkit import CLUSTER, RawConn, Response, Said, Say, make_server

#: Larger than the 64 KiB a connection may send before its handshake, far below 64 MiB.
BIG = 100 << 10
_MASTER_REPLY: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(m.Response)
#: Connects at once, more than asyncio's default listen backlog (100).
BURST = 300
#: Refused puts, each naming a tenant of its own.
TENANTS = 5000


@pytest.fixture
def idle_server() -> Iterator[ServerThread]:
    st = ServerThread(make_server(idle_timeout=0.3, unix=False)).start()
    try:
        yield st
    finally:
        st.stop()


def test_a_request_pipelined_behind_the_hello_may_be_as_large_as_any_handshaken_frame(
    server: ServerThread,
) -> None:
    hello = encode_frame(0, msgspec.msgpack.encode(Hello(PROTOCOL_VERSION, CLUSTER, "pipelined")))
    with RawConn(server.endpoint) as conn:
        conn.send(hello + encode_frame(1, msgspec.msgpack.encode(Say("x" * BIG))))
        assert conn.recv_frame()[0] == 0  # the Welcome
        rid, reply = conn.recv_reply()
        assert (rid, reply) == (1, Said("x" * BIG))


def test_a_client_idle_past_the_server_idle_timeout_reconnects_on_its_next_call(
    idle_server: ServerThread,
) -> None:
    with RpcClient(idle_server.endpoint, response_type=Response, cluster_id=CLUSTER) as client:
        assert client.call(Say("before")) == Said("before")
        deadline = time.monotonic() + 5
        while idle_server.server.connection_count and time.monotonic() < deadline:
            time.sleep(0.05)  # the server's sweep closes the idle connection
        assert idle_server.server.connection_count == 0
        assert client.call(Say("after")) == Said("after")


def _private_rss(pid: int) -> int:
    mem = psutil.Process(pid).memory_info()
    return int(mem.rss - mem.shared)


def _pipelined(conn: RawConn, messages: list[Any]) -> list[Any]:
    """Send `messages` at once; their master replies, in order."""
    conn.send(
        b"".join(encode_frame(i + 1, msgspec.msgpack.encode(x)) for i, x in enumerate(messages))
    )
    return [_MASTER_REPLY.decode(conn.recv_frame()[1]) for _ in messages]


def test_refused_puts_naming_new_tenants_leave_the_master_no_bigger() -> None:
    with kvpool_proc("master", "--port", "0", "--no-unix-socket", name="tenant master") as proc:
        with RawConn(proc.wait_ready()) as conn:
            conn.hello(cluster_id="kvpool")
            warm = [m.PutStart("fuzz", "k", -1) for _ in range(TENANTS)]
            assert all(
                r == m.PutStartReply(int(ErrorCode.INVALID_PARAMS)) for r in _pipelined(conn, warm)
            )
            before = _private_rss(proc.pid)
            puts = [m.PutStart("fuzz", "k", -1, tenant=f"t{i}") for i in range(TENANTS)]
            replies = _pipelined(conn, puts)
            after = _private_rss(proc.pid)
        assert all(r == m.PutStartReply(int(ErrorCode.INVALID_PARAMS)) for r in replies)
        assert after - before < 8 << 20, f"master grew {(after - before) >> 20} MiB"


def test_the_master_queues_a_burst_of_connects_while_it_is_busy() -> None:
    with kvpool_proc("master", "--port", "0", "--no-unix-socket", name="backlog master") as proc:
        host, port = proc.wait_ready().rsplit(":", 1)
        freeze(proc.pid)  # busy: nothing is accepted, the kernel's queue takes the burst
        try:
            socks, failed = connect_many((host, int(port)), "127.0.0.1", BURST, 1.0)
            for s in socks:
                s.close()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert failed == 0, f"{failed} of {BURST} connects not queued within 1 s"
