"""Event-loop choice and the public surface of kvpool.rpc / kvpool.protocol."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

import kvpool.protocol
import kvpool.rpc
from kvpool.rpc.loop import new_event_loop, run, uvloop_available


def test_uvloop_is_used_when_installed_and_not_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPOOL_UVLOOP", raising=False)
    installed = importlib.util.find_spec("uvloop") is not None
    assert uvloop_available() is installed
    loop = new_event_loop()
    try:
        assert ("uvloop" in type(loop).__module__) is installed
    finally:
        loop.close()


def test_kvpool_uvloop_0_forces_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOL_UVLOOP", "0")
    assert not uvloop_available()
    loop = new_event_loop()
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


def test_run_returns_the_coroutines_result() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run(answer()) == 42


def test_public_names_are_pinned() -> None:
    assert sorted(kvpool.rpc.__all__) == [
        "AsyncRpcClient",
        "Connection",
        "RpcClient",
        "RpcServer",
        "ServerThread",
        "Serving",
        "new_event_loop",
        "parse_address",
        "run",
    ]
    assert sorted(kvpool.protocol.__all__) == [
        "DEFAULT_MAX_FRAME_BYTES",
        "ERROR_FLAG",
        "ErrorReply",
        "FrameDecoder",
        "FrameEncoder",
        "FrameError",
        "FrameTooLarge",
        "Hello",
        "PROTOCOL_VERSION",
        "Welcome",
    ]
    for module in (kvpool.rpc, kvpool.protocol):
        for name in module.__all__:
            assert hasattr(module, name), name
