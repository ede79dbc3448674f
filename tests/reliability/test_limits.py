"""Bounded everything (issue #13): idle and half-open connections time out, connection counts
are capped per peer and in total with a clear refusal, and no number of idle sockets costs a
server a thread each or keeps a new client out. Real processes, real loopback sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import kvpool
from kvpool.errors import ErrorCode, KVPoolError
from kvpool.protocol.framing import FrameEncoder
from kvpool.protocol.handshake import PROTOCOL_VERSION, Hello
from kvpool.transfer.wire import RESP, RESP_MAGIC
from kvtest.procs import Proc, freeze, kvpool_proc, run_kvpool
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
    return run_kvpool("status", "--master", endpoint, "--timeout", "5", timeout=30)


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


@pytest.fixture
def node(master: tuple[Proc, str]) -> Iterator[tuple[Proc, str]]:
    _, endpoint = master
    proc = kvpool_proc(
        "node",
        "--master",
        endpoint,
        "--segment-size",
        "16MiB",
        "--no-progress",
        "--transfer-first-request-timeout",
        "6s",
        "--transfer-max-connections-per-peer",
        str(PER_PEER),
        name="limits node",
    )
    try:
        yield proc, proc.wait_ready()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        assert proc.stop() == 0, proc.output()


def test_idle_sockets_cost_a_node_no_threads_and_keep_no_store_out(
    master: tuple[Proc, str], node: tuple[Proc, str]
) -> None:
    _, master_endpoint = master
    proc, endpoint = node
    threads_before = thread_count(proc.pid)
    with idle_sockets(_address(endpoint), IDLE) as idle:
        with kvpool.Store(master_endpoint, protocol="tcp") as store:
            for i in range(20):
                assert store.put(f"limits/node/{i}", bytes([i]) * 5000)
            for i in range(20):
                assert store.get(f"limits/node/{i}") == bytes([i]) * 5000
        # Idle connections wait in one epoll: a handful of workers served the Store.
        assert thread_count(proc.pid) <= threads_before + 8
        idle.wait_all_closed(timeout=15)
        refused = sum(
            1
            for data in idle.received.values()
            if data[:4] == RESP_MAGIC
            and RESP.unpack(data[: RESP.size])[1] == ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
        )
        assert 0 < refused <= IDLE - PER_PEER
    assert "refusing a connection: too many connections from 127.0.0.2" in proc.output()


def test_a_frozen_node_fails_tcp_puts_and_gets_in_seconds(
    master: tuple[Proc, str], node: tuple[Proc, str]
) -> None:
    _, master_endpoint = master
    proc, _ = node
    with kvpool.Store(master_endpoint, protocol="tcp") as store:
        assert store.put("limits/frozen", b"f" * 10000)
        assert store.get("limits/frozen") == b"f" * 10000
        freeze(proc.pid)
        try:
            for attempt in (
                lambda: store.get("limits/frozen"),
                lambda: store.put("limits/frozen-2", b"g" * 10000),
            ):
                start = time.monotonic()
                with pytest.raises(KVPoolError) as failed:
                    attempt()
                assert failed.value.code == ErrorCode.TRANSFER_FAIL
                # The stall timeout (5 s), not the 60 s transfer timeout; a put that fails on
                # its arena tries once more through PutStart (kvpool.client.writer): 2 stalls.
                took = time.monotonic() - start
                print(f"frozen node: failed in {took:.1f} s", file=sys.stderr)
                assert took < 16
        finally:
            os.kill(proc.pid, signal.SIGCONT)
