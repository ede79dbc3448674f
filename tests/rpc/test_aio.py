"""The asyncio client against a live server (each test runs its own client loop)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from kvpool.errors import (
    ErrorCode,
    IllegalClient,
    KVPoolError,
    ObjectNotFound,
    RpcError,
    StoreClosed,
)
from kvpool.rpc.aio import AsyncRpcClient
from kvpool.rpc.loop import new_event_loop
from kvpool.rpc.thread import ServerThread
from kvtest.procs import free_port, wait_until
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

T = TypeVar("T")

# Every test here runs on the Unix socket and again on TCP (the `transport` fixture).
pytestmark = pytest.mark.usefixtures("transport")


def run(coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


async def async_wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the loop until `predicate()` holds; fail after `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {predicate}"
        await asyncio.sleep(0.001)


def _client(server: ServerThread, **kw: Any) -> AsyncRpcClient:
    kw.setdefault("cluster_id", CLUSTER)
    return AsyncRpcClient(server.endpoint, response_type=Response, **kw)


def test_async_calls_pipeline_and_match_replies(server: ServerThread) -> None:
    async def main() -> None:
        async with _client(server, client_name="a1") as c:
            assert await c.call(Add(1, 2)) == Sum(3)
            assert await c.call_as(Say("x"), Said) == Said("x")
            you = await c.call(WhoAmI())
            assert isinstance(you, You) and you.client_name == "a1"
            rng = random.Random(5)
            reqs = [Sleep(rng.random() * 0.01, i) if i % 3 else Add(i, i) for i in range(200)]
            replies = await asyncio.gather(*(c.call(r) for r in reqs))
            expect = [Slept(i) if i % 3 else Sum(2 * i) for i in range(200)]
            assert replies == expect
            # A group of 4 completes only if the four calls are in flight together.
            got = await asyncio.gather(*(c.call(Gather("aio", 4, i)) for i in range(4)))
            assert got == [Slept(i) for i in range(4)]

    run(main())
    assert server.server.connection_count in (0, 1)


def test_async_call_many_keeps_order_and_reports_errors(server: ServerThread) -> None:
    async def main() -> None:
        async with _client(server) as c:
            reqs = [Sleep(0.002 * (10 - i), i) for i in range(10)]
            assert await c.call_many(reqs, window=3) == [Slept(i) for i in range(10)]
            out = await c.call_many([Add(1, 1), Missing("k")], return_exceptions=True)
            assert out[0] == Sum(2) and isinstance(out[1], ObjectNotFound)
            with pytest.raises(ObjectNotFound):
                await c.call_many([Missing("k"), Add(1, 1)])
            assert await c.call_many([]) == []

    run(main())


def test_async_timeout_discards_the_late_reply(server: ServerThread) -> None:
    async def main() -> None:
        async with _client(server) as c:
            with pytest.raises(RpcError) as info:
                await c.call(Sleep(0.2, 1), timeout=0.05)
            assert info.value.code == ErrorCode.RPC_TIMEOUT
            assert await c.call(Sleep(0.3, 2)) == Slept(2)
            assert c.connected

    run(main())


def test_async_error_replies_raise_their_code(server: ServerThread) -> None:
    async def main() -> None:
        async with _client(server) as c:
            with pytest.raises(KVPoolError) as info:
                await c.call(Boom("bad"))
            assert info.value.code == ErrorCode.INTERNAL_ERROR
            with pytest.raises(ObjectNotFound):
                await c.call(Missing("k"))
            assert await c.call(Add(2, 2)) == Sum(4)

    run(main())


def test_async_handshake_refusal(server: ServerThread) -> None:
    async def main() -> None:
        async with _client(server, cluster_id="elsewhere") as c:
            with pytest.raises(IllegalClient):
                await c.connect()
            assert not c.connected

    run(main())


def test_async_client_reconnects_after_server_restart() -> None:
    port = free_port()
    st = ServerThread(make_server(port)).start()
    try:

        async def main() -> None:
            nonlocal st
            async with AsyncRpcClient(st.endpoint, response_type=Response, cluster_id=CLUSTER) as c:
                assert await c.call(Add(1, 1)) == Sum(2)
                st.stop()
                with pytest.raises(RpcError):
                    await c.call(Add(1, 1))
                st = ServerThread(make_server(port)).start()
                assert await c.call(Add(2, 2)) == Sum(4)

        run(main())
    finally:
        st.stop()


def test_async_close_fails_calls_in_flight_and_later_calls(server: ServerThread) -> None:
    async def main() -> None:
        c = _client(server)
        task = asyncio.ensure_future(c.call(Sleep(5, 1)))
        await async_wait_until(lambda: c._proto is not None and bool(c._proto.pending))
        await c.close()
        with pytest.raises(RpcError):
            await task
        with pytest.raises(StoreClosed):
            await c.call(Add(1, 1))
        await c.close()

    run(main())


def test_async_connect_to_nothing_is_rpc_fail() -> None:
    async def main() -> None:
        async with AsyncRpcClient(f"127.0.0.1:{free_port()}", response_type=Response) as c:
            with pytest.raises(RpcError) as info:
                await c.call(Add(1, 1))
            assert info.value.code == ErrorCode.RPC_FAIL

    run(main())


def test_async_close_while_connecting_leaves_no_connection(server: ServerThread) -> None:
    async def main() -> None:
        c = _client(server)
        connecting = asyncio.ensure_future(c.connect())
        await asyncio.sleep(0)  # the connect is under way, not finished
        await c.close()
        with pytest.raises(StoreClosed):
            await connecting
        assert not c.connected

    run(main())
    wait_until(lambda: server.server.connection_count == 0, what="no connection left")
