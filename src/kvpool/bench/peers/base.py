"""The one interface every system measured by `kvpool bench compare` implements.

A driver wraps one way of storing bytes (kvpool over shared memory, kvpool over TCP, Mooncake,
Redis, or a physical limit such as memcpy) behind the same six calls, so that the timing loop,
the interleaving, the verification, the table and the JSON are written once
(`kvpool.bench.peers.workload` and `kvpool.bench.peers.report`).

Threading and ownership: the harness calls a driver from one thread only, in this order:
`setup()` once, then, per case, `register` of the harness's buffers, any number of `put` /
`get` / `batch_put` / `batch_get` / `reset`, and `unregister`; then
`teardown()` exactly once (also when `setup` failed half-way, and when the run is interrupted).
A driver owns every process, socket and buffer it makes and releases all of them in `teardown`,
which must be idempotent.

Failure model: a system that is not installed raises `Unavailable` from `setup` (the run goes
on without it and the table says how to install it). Anything else that goes wrong, a failed
put, a missing key, a short read, raises `BenchError`: a benchmark that cannot do its job stops
loudly instead of reporting a number.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["BenchError", "Driver", "Read", "Unavailable"]

_F = TypeVar("_F", bound=Callable[..., Any])


Read = memoryview | bytes | bytearray
"""What a get hands back: a view of the caller's buffer, or a new object from the system."""


class Unavailable(Exception):
    """The system cannot run here; `install` is the command that would make it available."""

    def __init__(self, reason: str, install: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.install = install


class BenchError(RuntimeError):
    """The measured system failed an operation or returned wrong bytes."""


class Driver(ABC):
    """One measured system, reached one way (`system` / `path` name the rows it produces)."""

    #: Row label: "kvpool", "mooncake", "redis", "limit".
    system: str = ""
    #: How the bytes travel: "shm", "tcp", "memcpy", "socket".
    path: str = ""

    def __init__(self) -> None:
        self._chosen_apis: dict[tuple[str, bool], str] = {}

    @property
    def label(self) -> str:
        """`system/path`, how the table and the progress bar name this driver."""
        return f"{self.system}/{self.path}"

    @abstractmethod
    def setup(self, capacity: int) -> None:
        """Start what the system needs; afterwards it must hold `capacity` bytes of values.

        May block for seconds (process start-up). Raises `Unavailable` when the system is not
        installed, `BenchError` when it is installed but does not start.
        """

    def mode(self, op: str) -> str:
        """The semantics `op` ran with, for the JSON row's `"mode"`: kvpool's Store mode
        ("strict", or the read/write mode of a faster one); "" for other systems."""
        del op
        return ""

    def register(self, buffer: memoryview) -> None:
        """`buffer` holds values the harness will put, or is where it will get into.

        Called once per case for each buffer before any put or get, so a zero-copy API that
        needs registered memory (kvpool's `put_from` / `get_into`) can register it; no-op here.
        """
        del buffer

    def unregister(self, buffer: memoryview) -> None:
        """Undo `register` at the end of the case; no-op here."""
        del buffer

    def apis(self, op: str, batched: bool) -> tuple[str, ...]:
        """The client calls this driver can do `op` ("put" or "get") with, single or batched.

        When there are several (a copying and a zero-copy form, say), the harness times each
        during warm-up, picks the fastest with `use_api`, and names it in the results: every
        system is measured at its best, and which call that was is on the record.
        """
        del op, batched
        return ("",)

    def use_api(self, op: str, batched: bool, api: str) -> None:
        """Do `op` with `api` (one of `apis(op, batched)`) from now on."""
        if api not in self.apis(op, batched):
            raise BenchError(f"{self.label}: no {api!r} for {op} (batched={batched})")
        self._chosen_apis[(op, batched)] = api

    def api(self, op: str, batched: bool) -> str:
        """The call `op` is done with now: the chosen one, else the first of `apis`."""
        return self._chosen_apis.get((op, batched)) or self.apis(op, batched)[0]

    @abstractmethod
    def put(self, key: str, value: memoryview) -> None:
        """Store `value` under `key`, which is absent (the harness `reset`s before reusing keys)."""

    @abstractmethod
    def get(self, key: str, out: memoryview) -> Read:
        """The value of `key`: either written into `out` (return the filled prefix) or returned.

        `out` is a writable buffer at least as large as the value; a driver whose API returns a
        new object may ignore it. A miss raises `BenchError`.
        """

    @abstractmethod
    def batch_put(self, keys: Sequence[str], values: Sequence[memoryview]) -> None:
        """Store every value under its key in as few round trips as the system allows."""

    @abstractmethod
    def batch_get(self, keys: Sequence[str], outs: Sequence[memoryview]) -> Sequence[Read]:
        """The values of `keys`, in order, each as `get` would return it."""

    @abstractmethod
    def reset(self) -> None:
        """Remove every key stored so far, so that the same keys can be put again."""

    @abstractmethod
    def teardown(self) -> None:
        """Release everything `setup` made. Idempotent; safe after a failed `setup`."""
