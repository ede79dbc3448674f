"""`kvpool.children.Child`: the one way kvpool starts, waits on and stops another program."""

from __future__ import annotations

import ast
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from kvpool.children import Child, ChildError, free_port, wait_port
from kvtest.procs import Proc, wait_until

SRC = Path(__file__).resolve().parents[1] / "src" / "kvpool"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_no_module_in_src_starts_a_process_with_preexec_fn() -> None:
    """`preexec_fn` runs Python between fork and exec; in a process that already runs threads
    (a Store, a benchmark's readers) that can deadlock on a lock held at fork time. The death
    signal is set by `kvpool.children`'s exec launcher instead."""
    offenders = [
        f"{path.relative_to(SRC.parent)}:{node.lineno}"
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and any(k.arg == "preexec_fn" for k in node.keywords)
    ]
    assert offenders == []


# An owner with busy threads (as a Store or a benchmark has) starts an embedded pool, says the
# master's PID, then waits to be killed.
_THREADED_OWNER = textwrap.dedent(
    """
    import sys, threading, time
    from kvpool.client.embedded import EmbeddedPool, PoolSpec

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))  # holds and drops the GIL and the allocator's locks, all the time

    for i in range(4):
        threading.Thread(target=spin, daemon=True).start()
    pool = EmbeddedPool(PoolSpec(segment_size=0))
    pool.start()
    assert pool.master is not None
    print("master pid", pool.master.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_child_of_a_threaded_owner_dies_when_the_owner_is_killed() -> None:
    with Proc([sys.executable, "-c", _THREADED_OWNER], name="threaded owner") as owner:
        master_pid = int(owner.wait_for_line(r"master pid (\d+)", timeout=60).group(1))
        assert psutil.Process(master_pid).cmdline()[1:3] == ["-m", "kvpool"]  # exec'd, same PID
        try:
            owner.kill9()  # no finally runs in the owner: only the death signal can act
            wait_until(lambda: _gone(master_pid), timeout=30, what="the orphaned master to exit")
        finally:
            if not _gone(master_pid):
                psutil.Process(master_pid).kill()


def test_wait_line_finds_earlier_and_later_lines_and_fails_fast_on_exit() -> None:
    script = "import sys, time; print('one'); sys.stdin.read(); print('two'); sys.exit(3)"
    with Child([sys.executable, "-c", script], name="talker", stdin=True) as child:
        assert child.wait_line(r"one", timeout=30).group(0) == "one"
        child.close_stdin()
        assert child.wait_line(r"t(w)o", timeout=30).group(1) == "w"
        started = time.monotonic()
        with pytest.raises(ChildError, match=r"talker exited \(3\) before printing 'three'"):
            child.wait_line(r"three", timeout=60)
        assert time.monotonic() - started < 30  # the exit, not the deadline, ended the wait
        assert child.stop() == 3
        assert child.stop() == 3  # idempotent
    assert child.lines == ["one", "two"]


def test_wait_line_times_out_with_the_output_in_the_message() -> None:
    quiet = Child([sys.executable, "-c", "print('hello'); input()"], name="quiet", stdin=True)
    with quiet, pytest.raises(ChildError, match=r"(?s)no line matching 'bye' in 0.2 s.*hello"):
        quiet.wait_line("bye", timeout=0.2)


def test_stop_kills_a_child_that_ignores_sigterm() -> None:
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    with Child([sys.executable, "-c", script], name="stubborn") as child:
        child.wait_line("ready", timeout=30)
        assert child.stop(grace=0.2) == -signal.SIGKILL


def test_output_lines_are_bounded_and_offered_to_on_line() -> None:
    seen: list[str] = []
    script = "for i in range(50): print(i)"
    with Child([sys.executable, "-c", script], max_lines=10, on_line=seen.append) as child:
        assert child.popen.wait(timeout=30) == 0
        assert child.stop() == 0
    assert seen == [str(i) for i in range(50)]
    assert child.lines[-10:] == [str(i) for i in range(40, 50)] and len(child.lines) <= 20


def test_wait_port_fails_fast_when_the_child_exits() -> None:
    port = free_port()
    child = Child([sys.executable, "-c", "print('bye')"], name="no-listener")
    with child, pytest.raises(ChildError, match="no-listener exited before listening"):
        wait_port(port, time.monotonic() + 60, child)
