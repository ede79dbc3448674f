"""kvpool itself, measured the way a user on one host meets it.

The driver starts its own `kvpool master` and one `kvpool node` (the segment lives in that
second process, as in a real deployment where the inference process is only a client), then
opens a `kvpool.Store(master=..., segment_size=0, protocol=...)` in the benchmark process:

* path "shm": `protocol="auto"`, which on one host maps the node's shared-memory segment and
  copies with one memcpy per value (the default path);
* path "tcp": `protocol="tcp"`, which sends the bytes through the node's transfer server over
  loopback TCP, as between hosts.

The Store has two ways to do each operation: `put` / `batch_put` (which copy straight from the
caller's buffer) and `put_from` / `batch_put_from` (the same, for memory registered with
`register_buffer`); `get` / `batch_get` (which allocate the result) and `get_into` /
`batch_get_into` (into registered memory). The harness times both during warm-up and measures
the faster, as it does for Mooncake, and the results say which one ran.

With `fast=True` the Store runs in its faster modes for content-addressed keys (path
"shm+fast" / "tcp+fast"): `read_mode="cached"` (gets read remembered places, each checked by
its checksum, without asking the master; `kvpool.client.locations`) and `write_mode="nowait"`
(arena puts return once written and committed on the wire; `kvpool.client.pending`). The
driver flushes at every `reset` (untimed), so every put's answer is checked; a timed put phase
therefore leaves at most the queue's bound (64) of answers to after it. Every row says which
mode it ran in (`Driver.mode`): "strict" for today's semantics, else the mode's name.

Checksums stay on (the default): every get is verified by the Store against the xxh3 recorded
at put, on top of the harness's own byte comparison.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from kvpool.bench.peers.base import BenchError, Driver, Read, Unavailable
from kvpool.children import Child
from kvpool.override import override

__all__ = ["KvpoolDriver"]

_STARTUP_S = 60.0
_APIS = {
    ("put", False): ("put", "put_from"),
    ("put", True): ("batch_put", "batch_put_from"),
    ("get", False): ("get", "get_into"),
    ("get", True): ("batch_get", "batch_get_into"),
}


def _store_class() -> Any:
    """`kvpool.Store`, or `Unavailable` while the client or its commands are not built."""
    import importlib.util

    try:
        from kvpool.client import Store  # type: ignore[attr-defined,unused-ignore]
    except ImportError as exc:
        raise Unavailable(f"kvpool.client not available ({exc})") from exc
    for module in ("kvpool.cli.master", "kvpool.cli.node"):
        if importlib.util.find_spec(module) is None:
            raise Unavailable(f"kvpool.client not available ({module} is not built yet)")
    return Store


class KvpoolDriver(Driver):
    system = "kvpool"

    def __init__(self, path: str, fast: bool = False) -> None:
        super().__init__()
        if path not in ("shm", "tcp"):
            raise ValueError(f"kvpool path must be 'shm' or 'tcp', not {path!r}")
        self.transport = path
        self.fast = fast
        self.path = f"{path}+fast" if fast else path
        self._children: list[Child] = []
        self._store: Any = None

    @override
    def setup(self, capacity: int) -> None:
        store_cls = _store_class()
        deadline = time.monotonic() + _STARTUP_S
        master = self._start(["master", "--host", "127.0.0.1", "--port", "0"], "kvpool master")
        address = master.wait_ready(timeout=_STARTUP_S)
        # Twice what is held at once, so the allocator never runs out in the middle of a fill.
        node = self._start(
            [
                "node",
                "--master",
                address,
                "--segment-size",
                str(2 * capacity),
                "--host",
                "127.0.0.1",
                "--no-progress",
            ],
            "kvpool node",
        )
        node.wait_ready(timeout=max(1.0, deadline - time.monotonic()))
        protocol = "auto" if self.transport == "shm" else "tcp"
        modes = {"read_mode": "cached", "write_mode": "nowait"} if self.fast else {}
        with _faults("setup"):
            self._store = store_cls(master=address, segment_size=0, protocol=protocol, **modes)
            # Map the node's segment now, as a long-running client would have it mapped.
            self._store.warm_up()

    def _start(self, args: list[str], name: str) -> Child:
        child = Child([sys.executable, "-m", "kvpool", *args], name=name)
        self._children.append(child)
        return child

    def _client(self) -> Any:
        if self._store is None:
            raise BenchError("kvpool used before setup")
        return self._store

    @override
    def mode(self, op: str) -> str:
        if not self.fast:
            return "strict"
        return "cached" if op == "get" else "nowait"

    @override
    def register(self, buffer: memoryview) -> None:
        with _faults("register_buffer"):
            self._client().register_buffer(buffer)

    @override
    def unregister(self, buffer: memoryview) -> None:
        with _faults("unregister_buffer"):
            self._client().unregister_buffer(buffer)

    @override
    def apis(self, op: str, batched: bool) -> tuple[str, ...]:
        return _APIS[(op, batched)]

    @override
    def put(self, key: str, value: memoryview) -> None:
        api = self.api("put", False)
        with _faults(f"{api} {key!r}"):
            stored = getattr(self._client(), api)(key, value)
        if stored is not True:
            raise BenchError(f"kvpool {api} {key!r}: the key already existed")

    @override
    def get(self, key: str, out: memoryview) -> Read:
        api = self.api("get", False)
        with _faults(f"{api} {key!r}"):
            if api == "get":
                value: bytearray = self._client().get(key)
                return value
            n: int = self._client().get_into(key, out)
        return out[:n]

    @override
    def batch_put(self, keys: Sequence[str], values: Sequence[memoryview]) -> None:
        api = self.api("put", True)
        with _faults(api):
            codes = getattr(self._client(), api)(list(keys), list(values))
        bad = [(k, c) for k, c in zip(keys, codes, strict=True) if c != 0]
        if bad or len(codes) != len(keys):
            raise BenchError(f"kvpool {api} failed for {len(bad)} keys, first {bad[:1]}")

    @override
    def batch_get(self, keys: Sequence[str], outs: Sequence[memoryview]) -> list[Read]:
        if self.api("get", True) == "batch_get":
            with _faults("batch_get"):
                values = self._client().batch_get(list(keys))
            if len(values) != len(keys) or not all(isinstance(v, bytearray) for v in values):
                missing = [k for k, v in zip(keys, values, strict=False) if v is None]
                raise BenchError(f"kvpool batch_get: {len(missing)} of {len(keys)} keys missing")
            return list(values)
        with _faults("batch_get_into"):
            sizes = self._client().batch_get_into(list(keys), list(outs))
        if len(sizes) != len(keys):
            raise BenchError(f"kvpool batch_get_into: {len(sizes)} results for {len(keys)} keys")
        got: list[Read] = []
        for key, n, out in zip(keys, sizes, outs, strict=True):
            if n < 0:
                raise BenchError(f"kvpool batch_get_into {key!r}: error code {n}")
            got.append(out[:n])
        return got

    @override
    def reset(self) -> None:
        with _faults("flush"):
            self._client().flush()
        with _faults("remove_all"):
            self._client().remove_all(force=True)

    @override
    def teardown(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()
        while self._children:  # the node before the master it reports to
            self._children.pop().stop()


@contextlib.contextmanager
def _faults(what: str) -> Iterator[None]:
    """A kvpool error during the benchmark is the benchmark's failure: report it as one."""
    from kvpool.errors import KVPoolError

    try:
        yield
    except KVPoolError as exc:
        raise BenchError(f"kvpool {what}: {exc}") from exc
