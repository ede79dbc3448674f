"""`BusyPoll`: keep a server's event loop polling, not sleeping, while frames come close together.

A server asleep in `epoll_wait` is woken by the kernel when a frame arrives, and on a virtual
machine that wake-up is paid twice: by the sender, whose `send` pays for the wake-up of an
idle vCPU (an inter-processor interrupt, a VM exit), and by the request itself, which waits for
the server's vCPU to come back from its idle state. A Store's unwaited commit (`write_mode=
"nowait"`) or a lock-step call pays it on every request (docs/parts/perf-rpc.md, "Busy
polling" has the figures).

While a connection's frames arrive less than `window` apart (each connection's own: many clients
that each ping now and then do not count as a burst), the server does not sleep between them: after each frame it keeps one callback re-scheduling itself on the loop (`call_soon`) for
`window` seconds. A loop with a ready callback polls its sockets without waiting (asyncio's and
uvloop's alike), so the next frame is read as soon as it is there and its sender finds a
running reader. The first frame after a quiet spell never starts the polling (its gap says
nothing comes soon), and the polling stops `window` after the last frame: a server whose
clients pause costs at most one `window` of CPU per burst, and an idle server costs nothing.

The price is CPU on the server's core during bursts, the usual trade of busy polling (network
stacks and RDMA completion queues make it too). Where cores are scarce that CPU is taken from
someone: a client waiting for its reply, a node, another process. So the polling watches for
it: when the loop's thread spent a real share of its polling waiting for the CPU (the wall
time that passed against the thread's CPU time: `STARVED_SHARE` of it, and at least
`STARVED_MIN_S`), some other thread wanted that core, and the server stops polling and sleeps
between frames for `BACKOFF_S`, twice as long after each such time up to `MAX_BACKOFF_S` (and
back to `BACKOFF_S` after a burst polled without it). A kernel worker that runs for a few
microseconds does not count: only waiting that adds up. `window=0` turns it off (`kvpool
master --busy-poll-us 0`).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Final

from kvpool.errors import InvalidParams

__all__ = [
    "DEFAULT_BUSY_POLL_S",
    "DEFAULT_REPLY_POLL_S",
    "MAX_BUSY_POLL_S",
    "BusyPoll",
    "ReplyPoll",
    "check_window",
]

DEFAULT_BUSY_POLL_S: Final = 200e-6
"""The default window: longer than the gap between the commits of back-to-back 1 MiB puts
written through shared memory, much shorter than any client's pause between bursts."""
DEFAULT_REPLY_POLL_S: Final = 50e-6
"""The default window of a client waiting for a lock-step reply: a few of the master's answer
times on this kind of machine; a reply later than that is waited for asleep."""
MAX_BUSY_POLL_S: Final = 0.01
"""The longest window accepted: past it a server would spin through a client's think time."""
BACKOFF_S: Final = 0.05
"""How long the server sleeps between frames after its polling was preempted (first time)."""
MAX_BACKOFF_S: Final = 2.0
"""The longest such spell (after repeated preemption: a busy machine)."""


def check_window(name: str, window: object) -> float:
    """`window` as seconds, if it is a number from 0 to `MAX_BUSY_POLL_S`; else InvalidParams
    naming `name` (the setting of the server, the client or the poll being made)."""
    if not isinstance(window, int | float) or not 0 <= window <= MAX_BUSY_POLL_S:
        raise InvalidParams(f"{name}: {window!r} must be 0 to {MAX_BUSY_POLL_S} seconds")
    return float(window)


STARVED_SHARE: Final = 0.25
"""Polling stops when the thread waited for the CPU this share of the time it polled..."""
STARVED_MIN_S: Final = 100e-6
"""...and at least this long (a kernel worker's few microseconds are no contention)."""
_CHECK_EVERY: Final = 8
"""Polls between two looks at the thread's CPU time (a system call)."""
_thread_ns = time.thread_time_ns
_wall_ns = time.perf_counter_ns


def _starved(wall0: int, cpu0: int, floor_s: float) -> bool:
    """Whether this thread waited for the CPU for a real share of the time since `wall0`
    (`perf_counter_ns`) while it used the CPU time since `cpu0` (`thread_time_ns`): at least
    `STARVED_SHARE` of it and `floor_s` seconds."""
    wall = _wall_ns() - wall0
    waited = wall - (_thread_ns() - cpu0)
    return waited > floor_s * 1e9 and waited > STARVED_SHARE * wall


class BusyPoll:
    """The busy polling of one event loop (module docstring). `arrived()` is called for every
    chunk of frames a connection read, on the loop's thread."""

    __slots__ = (
        "_backoff",
        "_clock",
        "_cpu0",
        "_loop",
        "_quiet_until",
        "_spinning",
        "_ticks",
        "_until",
        "_wall0",
        "backoffs",
        "polls",
        "window",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, window: float) -> None:
        self._loop = loop
        #: Seconds the loop keeps polling after a frame (0: never).
        self.window = check_window("busy_poll", window)
        self._clock = time.perf_counter
        self._until = 0.0
        self._spinning = False
        self._ticks = 0
        self._wall0 = self._cpu0 = 0
        self._quiet_until = 0.0
        self._backoff = BACKOFF_S
        #: Times the polling was started (a burst began), for tests and metrics.
        self.polls = 0
        #: Times the polling stopped because the thread waited for its core (it was wanted).
        self.backoffs = 0

    def arrived(self, last: float) -> float:
        """Frames were read on a connection whose previous ones came at `last` (0: none yet):
        poll on for `window` when these came within `window` of those. Returns the time to
        pass as `last` next time. (Per connection: ten thousand clients pinging once a
        second each come more often than the window, but none of them in a burst.)"""
        now = self._clock()
        if now - last <= self.window:
            self._until = now + self.window
            if not self._spinning and now >= self._quiet_until:
                self._spinning = True
                self.polls += 1
                self._ticks = 0
                self._wall0, self._cpu0 = _wall_ns(), _thread_ns()
                self._loop.call_soon(self._spin)
        return now

    def _spin(self) -> None:
        now = self._clock()
        if now >= self._until:
            self._spinning = False
            if not _starved(self._wall0, self._cpu0, STARVED_MIN_S):
                self._backoff = BACKOFF_S  # a whole burst without taking anyone's core
            return
        self._ticks += 1
        if not self._ticks % _CHECK_EVERY and _starved(self._wall0, self._cpu0, STARVED_MIN_S):
            # Waited for the CPU while polling: the core is wanted elsewhere. Sleep between
            # frames for a while, longer each time this happens.
            self._spinning = False
            self.backoffs += 1
            self._quiet_until = now + self._backoff
            self._backoff = min(2 * self._backoff, MAX_BACKOFF_S)
            return
        self._loop.call_soon(self._spin)

    @property
    def spinning(self) -> bool:
        """Whether the loop is polling now."""
        return self._spinning

    @property
    def quiet_until(self) -> float:
        """Until when (`time.perf_counter`) no polling starts: the end of a back-off spell."""
        return self._quiet_until


class ReplyPoll:
    """A client's busy wait for the reply to a lock-step call (`kvpool.rpc.channel`): for up to
    `window` seconds the caller asks the socket without blocking before it sleeps in `recv`.

    The same trade as `BusyPoll`, on the other end: a caller asleep in `recv` is woken by the
    server's reply, which costs the server's `send` a wake-up of an idle vCPU and the caller the
    time its vCPU takes to come back; one that asks in a loop finds the reply as it lands. The
    same guard too: once the thread waited for the CPU for half its window or more while it
    polled, callers sleep at once for `BACKOFF_S`, twice as long each time, up to
    `MAX_BACKOFF_S`.
    Shared by the threads of one client (a race on its counters costs a poll, never a reply)."""

    __slots__ = ("_backoff", "_clock", "_quiet_until", "backoffs", "window")

    def __init__(self, window: float) -> None:
        self.window = check_window("reply_poll", window)
        self._clock = time.perf_counter
        self._quiet_until = 0.0
        self._backoff = BACKOFF_S
        #: Times the polling stopped because the thread waited for its core.
        self.backoffs = 0

    def recv(self, sock: socket.socket, nbytes: int) -> bytes | None:
        """What `sock` holds within `window` (b"" at EOF), or None: nothing came (or polling is
        backed off) and the caller is to block in `recv` as usual."""
        clock = self._clock
        start = clock()
        if start < self._quiet_until:
            return None
        recv = sock.recv
        dontwait = socket.MSG_DONTWAIT
        try:
            return recv(nbytes, dontwait)  # already here: no count of switches needed
        except (BlockingIOError, InterruptedError):
            pass
        wall0, cpu0 = _wall_ns(), _thread_ns()
        end = start + self.window
        while True:
            try:
                return recv(nbytes, dontwait)
            except (BlockingIOError, InterruptedError):
                pass
            if clock() >= end:
                break
        if _starved(wall0, cpu0, self.window / 2):
            self.backoffs += 1
            self._quiet_until = clock() + self._backoff
            self._backoff = min(2 * self._backoff, MAX_BACKOFF_S)
        else:
            self._backoff = BACKOFF_S
        return None
