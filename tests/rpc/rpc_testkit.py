"""Tiny test service for the RPC layer: messages, a handler, and a runnable server.

The RPC layer is generic, so its tests bring their own messages. They are ``array_like`` on
purpose: `ErrorReply` is not (it is a plain tagged map), and the client must still tell them
apart (the error flag in the request id makes that possible).

Run as a script to get the service in its own process (what the restart test and the benchmark
use):  ``python tests/rpc/rpc_testkit.py serve [--port N] [--cluster-id ID]``; it prints
``listening on HOST:PORT`` once it serves and stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from typing import Any

import msgspec

from kvpool.errors import ObjectNotFound
from kvpool.protocol.framing import ERROR_FLAG, ErrorReply, Frame, FrameDecoder, encode_frame
from kvpool.protocol.handshake import PROTOCOL_VERSION, Hello, Welcome
from kvpool.rpc.loop import new_event_loop
from kvpool.rpc.server import Connection, RpcServer
from kvpool.rpc.thread import ServerThread

CLUSTER = "test-cluster"


class Add(msgspec.Struct, tag=True, array_like=True):
    a: int
    b: int


class Say(msgspec.Struct, tag=True, array_like=True):
    text: str


class Sleep(msgspec.Struct, tag=True, array_like=True):
    """Answered by a task after `seconds` (server-side latency, for pipelining and timeouts)."""

    seconds: float
    token: int


class Boom(msgspec.Struct, tag=True, array_like=True):
    """The handler raises a plain exception: the client must get INTERNAL_ERROR."""

    message: str


class Missing(msgspec.Struct, tag=True, array_like=True):
    """The handler raises ObjectNotFound: the client must get that code back."""

    key: str


class WhoAmI(msgspec.Struct, tag=True, array_like=True):
    """Answered with the connection's id and client name."""


class Gather(msgspec.Struct, tag=True, array_like=True):
    """Answered only once `n` Gathers of the same `group` are waiting at the server at the same
    time: a client that does not pipeline can never complete a group of n > 1."""

    group: str
    n: int
    token: int


class Big(msgspec.Struct, tag=True, array_like=True):
    """Answered with a Said of `n` bytes (a reply much larger than its request)."""

    n: int


class BadReply(msgspec.Struct, tag=True, array_like=True):
    """The handler returns something msgspec cannot encode: SERIALIZE_FAIL."""


class SlowBoom(msgspec.Struct, tag=True, array_like=True):
    """An async handler that raises after `seconds`: INTERNAL_ERROR from a task."""

    seconds: float


class Kick(msgspec.Struct, tag=True, array_like=True):
    """The service closes this connection (as the master does to an evicted client)."""


class Finished(msgspec.Struct, tag=True, array_like=True):
    """Answered with Sum(number of members of `group` whose handler ran to the end)."""

    group: str


class Sum(msgspec.Struct, tag=True, array_like=True):
    value: int


class Said(msgspec.Struct, tag=True, array_like=True):
    text: str


class Slept(msgspec.Struct, tag=True, array_like=True):
    token: int


class You(msgspec.Struct, tag=True, array_like=True):
    conn_id: int
    client_name: str


Request = (
    Add
    | Say
    | Sleep
    | Boom
    | Missing
    | WhoAmI
    | Gather
    | Big
    | BadReply
    | SlowBoom
    | Kick
    | Finished
)
Response = Sum | Said | Slept | You


class Unknown(msgspec.Struct, tag=True, array_like=True):
    """Valid msgpack, well-formed, but not a request this service knows."""

    x: int


async def _sleep(seconds: float, token: int) -> Slept:
    await asyncio.sleep(seconds)
    return Slept(token)


class _Group:
    def __init__(self) -> None:
        self.arrived = 0
        self.finished = 0  # members whose handler ran to the end (not cancelled)
        self.full = asyncio.Event()


_groups: dict[str, _Group] = {}


async def _gather(request: Gather) -> Slept:
    group = _groups.setdefault(request.group, _Group())
    group.arrived += 1
    if group.arrived >= request.n:
        group.full.set()
    await group.full.wait()
    group.finished += 1
    return Slept(request.token)


async def _slow_boom(seconds: float) -> Any:
    await asyncio.sleep(seconds)
    raise ValueError("slow boom")


def handler(request: Any, conn: Connection) -> Any:
    if isinstance(request, Finished):
        group = _groups.get(request.group)
        return Sum(group.finished if group else 0)
    if isinstance(request, Big):
        return Said("x" * request.n)
    if isinstance(request, BadReply):
        return object()
    if isinstance(request, SlowBoom):
        return _slow_boom(request.seconds)
    if isinstance(request, Kick):
        conn.close()
        return Sum(0)
    if isinstance(request, Gather):
        return _gather(request)
    if isinstance(request, Add):
        return Sum(request.a + request.b)
    if isinstance(request, Say):
        return Said(request.text)
    if isinstance(request, Sleep):
        return _sleep(request.seconds, request.token)
    if isinstance(request, Boom):
        raise RuntimeError(request.message)
    if isinstance(request, Missing):
        raise ObjectNotFound(f"no object {request.key!r}")
    if isinstance(request, WhoAmI):
        return You(conn.conn_id, conn.client_name)
    raise AssertionError(f"unexpected request {request!r}")


class RawConn:
    """A plain socket speaking frames by hand, for feeding a server what a client never would.

    `endpoint` is "host:port" or an abstract Unix socket name (leading NUL)."""

    def __init__(self, endpoint: str, timeout: float = 5.0) -> None:
        if endpoint.startswith("\0"):  # a server's abstract Unix socket (its unix_address)
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            try:
                self.sock.connect(endpoint)
            except OSError:
                self.sock.close()
                raise
        else:
            host, port = endpoint.rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []

    def hello(self, cluster_id: str = CLUSTER, version: int = PROTOCOL_VERSION) -> Any:
        self.send(encode_frame(0, msgspec.msgpack.encode(Hello(version, cluster_id, "raw"))))
        rid, payload = self.recv_frame()
        if rid & ERROR_FLAG:
            return msgspec.msgpack.decode(payload, type=ErrorReply)
        return msgspec.msgpack.decode(payload, type=Welcome)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, request_id: int, message: Any) -> None:
        self.send(encode_frame(request_id, msgspec.msgpack.encode(message)))

    def recv_frame(self) -> Frame:
        """The next frame; raises EOFError when the server closed the connection first."""
        while not self.frames:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("server closed the connection")
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    def recv_reply(self) -> tuple[int, Any]:
        """(request id, decoded reply or ErrorReply)."""
        rid, payload = self.recv_frame()
        if rid & ERROR_FLAG:
            return rid & ~ERROR_FLAG, msgspec.msgpack.decode(payload, type=ErrorReply)
        return rid, msgspec.msgpack.decode(payload, type=Response)

    def closed_by_peer(self) -> bool:
        """True once the server has closed (EOF or reset), after any frames it sent."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.frames.extend(self.decoder.feed(data))
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_server(port: int = 0, cluster_id: str = CLUSTER, **kw: Any) -> RpcServer:
    return RpcServer(handler, request_type=Request, port=port, cluster_id=cluster_id, **kw)


def server_thread(port: int = 0, **kw: Any) -> ServerThread:
    return ServerThread(make_server(port, **kw)).start()


def _serve(port: int, cluster_id: str) -> None:
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    server = make_server(port, cluster_id)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    async def main() -> None:
        await server.start()
        host, bound = server.address
        print(f"rpc test server listening on {host}:{bound}", flush=True)
        await stop.wait()
        await server.close()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "serve":
        sys.exit("usage: rpc_testkit.py serve [--port N] [--cluster-id ID]")
    opts = dict(zip(args[1::2], args[2::2], strict=False))
    _serve(int(opts.get("--port", "0")), opts.get("--cluster-id", CLUSTER))
