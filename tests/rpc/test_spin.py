"""Busy polling (`kvpool.rpc.spin`): a server keeps polling while frames come close together and
stops after its window; a client waits for a lock-step reply by polling for a while and then
asleep; both stop polling for a while once their thread waited for the CPU a real share of the
time it polled (a core shared with a CPU hog, pinned there by the test)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from kvpool.cli import main as cli
from kvpool.client import Store
from kvpool.errors import InvalidParams
from kvpool.master.config import MasterConfig
from kvpool.rpc.client import RpcClient
from kvpool.rpc.spin import DEFAULT_BUSY_POLL_S, DEFAULT_REPLY_POLL_S, BusyPoll, ReplyPoll
from kvpool.rpc.thread import ServerThread
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from rpc.rpc_testkit import CLUSTER, Add, Response, Sleep, Slept, Sum, make_server, server_thread


def _busy(st: ServerThread) -> BusyPoll:
    busy = st.server.busy
    assert busy is not None
    return busy


def _client(st: ServerThread, **kw: float) -> RpcClient:
    return RpcClient(st.endpoint, response_type=Response, cluster_id=CLUSTER, **kw)


def test_back_to_back_calls_keep_the_server_polling_until_the_window_ends(
    server: ServerThread,
) -> None:
    busy = _busy(server)
    assert busy.window == DEFAULT_BUSY_POLL_S
    assert busy.polls == 0
    with _client(server) as c:
        for i in range(300):
            assert c.call(Add(i, 1)) == Sum(i + 1)
    assert busy.polls >= 1
    # It polls only while frames come: `window` after the last one it sleeps again.
    wait_until(lambda: not busy.spinning, timeout=5.0, what="the polling to end")


def test_calls_far_apart_never_start_polling(server: ServerThread) -> None:
    busy = _busy(server)
    with _client(server) as c:
        assert c.call(Add(0, 2)) == Sum(2)  # connected (the handshake's frames may poll)
        wait_until(lambda: not busy.spinning, timeout=5.0, what="the polling to end")
        before = busy.polls
        for i in range(5):
            time.sleep(0.02)  # the input: a gap 100 times the window
            assert c.call(Add(i, 2)) == Sum(i + 2)
    assert busy.polls == before


def test_calls_of_many_connections_one_each_are_no_burst(server: ServerThread) -> None:
    """The gap that counts is each connection's own: clients that each send now and then (a
    fleet's pings) never keep the server polling, however many there are."""
    busy = _busy(server)
    clients = [_client(server) for _ in range(20)]
    try:
        for i, c in enumerate(clients):
            assert c.call(Add(i, 7)) == Sum(i + 7)  # connected
        wait_until(lambda: not busy.spinning, timeout=5.0, what="the polling to end")
        # (Not in a back-off spell either, where nothing would start it anyway.)
        wait_until(lambda: busy.quiet_until <= time.perf_counter(), timeout=5.0, what="no back-off")
        time.sleep(0.005)  # the input: each connection's last frame 25 windows ago
        before = busy.polls
        for _ in range(3):  # back to back overall, one window apart per connection at most
            for i, c in enumerate(clients):
                assert c.call(Add(i, 8)) == Sum(i + 8)
            time.sleep(0.005)
        assert busy.polls == before
        # One of them in a burst of its own does start it (as soon as no back-off holds it:
        # on a loaded machine the server may have waited for its CPU while it polled).
        deadline = time.monotonic() + 20
        i = 0
        while busy.polls == before and time.monotonic() < deadline:
            assert clients[0].call(Add(i, 9)) == Sum(i + 9)
            i += 1
        assert busy.polls > before
    finally:
        for c in clients:
            c.close()


def test_busy_poll_zero_turns_it_off() -> None:
    st = server_thread(busy_poll=0)
    try:
        assert st.server.busy is None
        with _client(st) as c:
            for i in range(50):
                assert c.call(Add(i, 3)) == Sum(i + 3)
    finally:
        st.stop()


@pytest.mark.parametrize("window", [-1e-6, 0.5, "200"])
def test_a_bad_window_is_refused_everywhere(window: object) -> None:
    with pytest.raises(InvalidParams, match="busy_poll"):
        make_server(busy_poll=window)
    with pytest.raises(InvalidParams, match="reply_poll"):
        RpcClient("127.0.0.1:1", response_type=Response, reply_poll=window)  # type: ignore[arg-type]
    if isinstance(window, float):
        with pytest.raises(InvalidParams, match="rpc_busy_poll"):
            MasterConfig(rpc_busy_poll=window)


def test_kvpool_master_refuses_a_window_past_ten_milliseconds() -> None:
    out = CliRunner().invoke(cli, ["master", "--busy-poll-us", "20000"])
    assert out.exit_code == 2
    assert "--busy-poll-us" in out.output


def test_a_reply_later_than_the_window_is_waited_for_asleep(server: ServerThread) -> None:
    with _client(server, reply_poll=20e-6) as c:
        for i in range(5):
            assert c.call(Sleep(0.01, i)) == Slept(i)  # 500 windows late
            assert c.call(Add(i, 4)) == Sum(i + 4)
        conn = c._conn
        assert conn is not None
        if conn.transport == "unix":
            assert isinstance(conn.poll, ReplyPoll)
        else:
            assert conn.poll is None  # over TCP the reply may be a host away


def test_reply_poll_zero_blocks_at_once(server: ServerThread) -> None:
    with _client(server, reply_poll=0) as c:
        assert c.call(Add(1, 1)) == Sum(2)
        assert c._conn is not None and c._conn.poll is None


# -- sharing a core with a CPU hog ---------------------------------------------------------


@contextlib.contextmanager
def _hog_on(cpu: int) -> Iterator[None]:
    """A process that spins on `cpu` until the block ends (killed by its PID)."""
    hog = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        os.sched_setaffinity(hog.pid, {cpu})
        yield
    finally:
        hog.kill()
        hog.wait(timeout=10)


def _two_cpus() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: one shared with a hog, one for the other side")
    return cpus[0], cpus[1]


@contextlib.contextmanager
def _pinned(tid: int, cpu: int) -> Iterator[None]:
    before = os.sched_getaffinity(tid)
    os.sched_setaffinity(tid, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(tid, before)


@contextlib.contextmanager
def _sharing_a_core_with_a_hog(polling: int, other: int) -> Iterator[None]:
    """Thread `polling` on one CPU with a CPU hog, thread `other` on another (0: this one)."""
    shared, spare = _two_cpus()
    with _pinned(polling, shared), _pinned(other, spare), _hog_on(shared):
        yield


def _native_id(st: ServerThread) -> int:
    thread = st._thread
    assert thread is not None and thread.native_id is not None
    return thread.native_id


def test_a_server_whose_core_is_wanted_stops_polling() -> None:
    _two_cpus()
    # A 5 ms window: calls slowed down by the hog still come within it, so the server polls
    # and waits for its CPU behind the hog while it does.
    server = server_thread(busy_poll=0.005)
    try:
        busy = _busy(server)
        deadline = time.monotonic() + 30
        with (
            _sharing_a_core_with_a_hog(_native_id(server), 0),
            _client(server, reply_poll=0) as c,
        ):
            i = 0
            while busy.backoffs == 0 and time.monotonic() < deadline:
                assert c.call(Add(i, 5)) == Sum(i + 5)
                i += 1
        assert busy.backoffs >= 1, f"never backed off in {i} calls"
    finally:
        server.stop()


def test_a_client_whose_core_is_wanted_stops_polling(server: ServerThread) -> None:
    deadline = time.monotonic() + 30
    with (
        _sharing_a_core_with_a_hog(0, _native_id(server)),
        _client(server, reply_poll=0.005) as c,
    ):
        c.call(Add(0, 0))
        conn = c._conn
        assert conn is not None
        if conn.transport != "unix":
            pytest.skip("the reply poll is for the Unix socket")
        poll = conn.poll
        assert poll is not None
        i = 0
        # Replies 10 ms late: the client polls its whole 5 ms window each time, and is
        # kept waiting behind the hog sooner or later.
        while poll.backoffs == 0 and time.monotonic() < deadline:
            assert c.call(Sleep(0.01, i)) == Slept(i)
            i += 1
    assert poll.backoffs >= 1, f"never backed off in {i} calls"


def test_a_store_passes_its_busy_poll_to_its_master_connection(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(nodes=0)
    with pytest.raises(InvalidParams, match="busy_poll"):
        Store(p.address, busy_poll=0.02)
    with Store(p.address) as s:
        s.exists("k")
        conn = s._node.rpc._conn
        assert conn is not None and conn.transport == "unix"
        assert conn.poll is not None and conn.poll.window == DEFAULT_REPLY_POLL_S
    with Store(p.address, busy_poll=0) as s:
        s.exists("k")
        conn = s._node.rpc._conn
        assert conn is not None and conn.poll is None
