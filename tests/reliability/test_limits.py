"""Bounded everything (issue #13): idle and half-open connections time out, connection counts
are capped per peer and in total with a clear refusal, and no number of idle sockets costs a
server a thread each or keeps a new client out. Real processes, real loopback sockets."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

import kvpool
from kvpool.errors import ErrorCode
from kvpool.protocol.framing import FrameEncoder
from kvpool.protocol.handshake import PROTOCOL_VERSION, Hello
from kvtest.procs import Proc, kvpool_proc
from reliability.idle import idle_sockets
from reliability.malformed import thread_count

IDLE = 1500
PER_PEER = 500


def _address(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def _hello() -> bytes:
    return FrameEncoder().encode(0, Hello(PROTOCOL_VERSION, "kvpool", "idle"))


def _master(*flags: str) -> Iterator[tuple[Proc, str]]:
    proc = kvpool_proc("master", "--port", "0", *flags, name="limits master")
    try:
        yield proc, proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()


@pytest.fixture
def master() -> Iterator[tuple[Proc, str]]:
    # The handshake limit outlasts opening all the idle sockets, so they pile up to the cap.
    yield from _master("--rpc-handshake-timeout", "6s", "--max-connections-per-peer", str(PER_PEER))


@pytest.fixture
def idle_master() -> Iterator[tuple[Proc, str]]:
    yield from _master("--rpc-idle-timeout", "3s")


def _status(endpoint: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool", "status", "--master", endpoint, "--timeout", "5"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_idle_sockets_cannot_keep_a_store_or_status_out_of_the_master(
    master: tuple[Proc, str],
) -> None:
    proc, endpoint = master
    threads_before = thread_count(proc.pid)
    with idle_sockets(_address(endpoint), IDLE) as idle:
        # Past the per-peer cap, connections are refused at once, with a reason.
        idle.poll(0.5)
        with kvpool.Store(endpoint, segment_size="4MiB") as store:
            assert store.put("limits/k", b"v" * 1000)
            assert store.get("limits/k") == b"v" * 1000
        status = _status(endpoint)
        assert status.returncode == 0, status.stderr
        assert thread_count(proc.pid) <= threads_before + 4
        # Every idle socket is closed by the handshake timeout, with an error frame.
        idle.wait_all_closed(timeout=15)
        codes = idle.error_codes()
        refused = codes.count(int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS))
        timed_out = codes.count(int(ErrorCode.RPC_TIMEOUT))
        # How many were refused depends on how fast this machine opened them (the first ones
        # may time out before the last are open); every socket got one clear answer.
        assert refused > 0 and timed_out >= PER_PEER and refused + timed_out == IDLE
    assert "refusing a connection: too many connections from 127.0.0.2" in proc.output()


def test_an_idle_connection_is_closed_but_a_live_store_is_never_cut(
    idle_master: tuple[Proc, str],
) -> None:
    _proc, endpoint = idle_master
    with (
        kvpool.Store(endpoint, segment_size="4MiB") as store,
        idle_sockets(_address(endpoint), 3, send=_hello()) as idle,
    ):
        waited = idle.wait_all_closed(timeout=10)
        assert 2.0 < waited < 8
        assert idle.error_codes().count(int(ErrorCode.RPC_TIMEOUT)) == 3
        # The Store pings every second: well past the 3 s idle limit it still works, and its
        # heartbeat never failed.
        assert store.put("limits/live", b"x")
        assert store.get("limits/live") == b"x"
