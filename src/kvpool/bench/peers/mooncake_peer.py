"""The real Mooncake Store as a peer (PyPI `mooncake-transfer-engine-non-cuda`, extra `bench`).

Set up as Mooncake documents a single-host deployment, on loopback only:

* `mooncake_master --rpc_address=127.0.0.1 --rpc_port=P --metrics_host=127.0.0.1
  --metrics_port=Q`. Never with `--enable_http_metadata_server`: that embedded server ignores
  its host flag and binds every interface.
* The Python metadata server, `python -m mooncake.http_metadata_server --host 127.0.0.1`.
* A second process (`python -m kvpool.bench.peers.mooncake_peer node ...`) contributes the
  global segment, as `kvpool node` does for kvpool, so the data sits in another process and
  crosses it the way Mooncake moves data between processes on one host: its TCP transport.
* The benchmark's client contributes nothing (`global_segment_size=0`), `protocol="tcp"`.

Mooncake has two ways to do each operation: the copying `put` / `get` / `put_batch` /
`get_batch` (staged through the client's local buffer) and the zero-copy `put_from` /
`get_into` / `batch_put_from` / `batch_get_into` on memory registered with `register_buffer`.
Which is faster depends on the size and the machine, so the harness times both during warm-up
and measures the faster; the results say which one ran.

Mooncake's client-side TCP listener binds all interfaces (no flag restricts it), which is why
the test suite starts this driver only when KVPOOL_TEST_REAL_MOONCAKE=1.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvpool.bench.peers.base import BenchError, Driver, Read, Unavailable
from kvpool.children import Child, free_port, wait_port
from kvpool.override import override

__all__ = ["MooncakeDriver", "find_mooncake_master"]

INSTALL = (
    "pip install 'kvpool[bench]'  (Debian also needs: apt-get install libibverbs1 librdmacm1 "
    "libnuma1)"
)
# The client's staging buffer: Mooncake's copying API stages every value (and a whole batch)
# through it, so it must hold the largest value or batch measured.
_LOCAL_BUFFER = 128 << 20
_STARTUP_S = 60.0
_APIS = {
    ("put", False): ("put", "put_from"),
    ("put", True): ("put_batch", "batch_put_from"),
    ("get", False): ("get", "get_into"),
    ("get", True): ("get_batch", "batch_get_into"),
}
# Mooncake logs every INFO line to stderr, through the progress bar; MC_LOG_LEVEL (not glog's
# GLOG_minloglevel, which it ignores) keeps the errors only.
_LOG_ENV = {"MC_LOG_LEVEL": "ERROR"}


def _quiet_log() -> None:
    # Read when Mooncake's extension sets up logging; importing the `mooncake` package already
    # loads it, so this runs before any mooncake import. Only a default: a user's value wins.
    for name, value in _LOG_ENV.items():
        os.environ.setdefault(name, value)


def find_mooncake_master() -> str | None:
    """The mooncake_master binary: the one inside the wheel first, then PATH."""
    _quiet_log()
    try:
        import mooncake
    except ImportError:
        return None
    inside = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    if os.access(inside, os.X_OK):
        return inside
    return shutil.which("mooncake_master")


def _import_store() -> Any:
    _quiet_log()
    try:
        import mooncake.store as store_module
    except (ImportError, OSError) as exc:  # OSError: a missing libibverbs / libnuma
        raise Unavailable(f"the Mooncake wheel does not import ({exc})", INSTALL) from exc
    # kvpool ships a pure-Python `mooncake.store` (compat/mooncake-shim) that runs on kvpool;
    # measuring it here would compare kvpool with itself. The real one is a C++ extension.
    origin = getattr(store_module, "__file__", "") or ""
    if not origin.endswith((".so", ".pyd")):
        raise Unavailable(
            f"mooncake.store at {origin} is not the real Mooncake (kvpool's shim?)", INSTALL
        )
    return store_module.MooncakeDistributedStore


class MooncakeDriver(Driver):
    system = "mooncake"
    path = "tcp"

    def __init__(self) -> None:
        super().__init__()
        self._children: list[Child] = []
        self._store: Any = None
        self._registered: list[memoryview] = []  # kept alive while Mooncake holds their address

    @override
    def setup(self, capacity: int) -> None:
        _quiet_log()
        store_cls = _import_store()
        master_bin = find_mooncake_master()
        if master_bin is None:
            raise Unavailable("mooncake_master is not installed", INSTALL)
        rpc_port, metrics_port, meta_port = free_port(), free_port(), free_port()
        deadline = time.monotonic() + _STARTUP_S
        master = self._start(
            [
                master_bin,
                "--rpc_address=127.0.0.1",
                f"--rpc_port={rpc_port}",
                "--metrics_host=127.0.0.1",
                f"--metrics_port={metrics_port}",
                "--enable_http_metadata_server=false",
            ],
            "mooncake_master",
        )
        meta = self._start(
            [
                sys.executable,
                "-m",
                "mooncake.http_metadata_server",
                "--host",
                "127.0.0.1",
                "--port",
                str(meta_port),
                "--log-level",
                "WARNING",
            ],
            "mooncake_http_metadata_server",
        )
        wait_port(rpc_port, deadline, master)
        wait_port(meta_port, deadline, meta)
        master_addr = f"127.0.0.1:{rpc_port}"
        metadata = f"http://127.0.0.1:{meta_port}/metadata"
        # Twice the bytes held at once: the master starts evicting at 90 % full.
        node = self._start(
            [
                sys.executable,
                "-m",
                "kvpool.bench.peers.mooncake_peer",
                "node",
                master_addr,
                metadata,
                str(2 * capacity),
            ],
            "mooncake-node",
            stdin=True,
        )
        node.wait_line(r"mooncake node ready", timeout=max(1.0, deadline - time.monotonic()))
        store = store_cls()
        rc = store.setup(
            "127.0.0.1", metadata, 0, _LOCAL_BUFFER, "tcp", "", master_addr
        )  # positional: the binding has no keyword defaults (§1.2)
        if rc != 0:
            raise BenchError(f"Mooncake client setup returned {rc}")
        self._store = store  # only now: methods on a store that is not set up segfault (§1.1)

    def _start(self, args: list[str], name: str, stdin: bool = False) -> Child:
        child = Child(args, name=name, env=_LOG_ENV, stdin=stdin)
        self._children.append(child)
        return child

    def _client(self) -> Any:
        if self._store is None:
            raise BenchError("mooncake used before setup")
        return self._store

    @override
    def register(self, buffer: memoryview) -> None:
        rc = self._client().register_buffer(_address(buffer), len(buffer))
        if rc != 0:
            raise BenchError(f"mooncake register_buffer returned {rc}")
        self._registered.append(buffer)

    @override
    def unregister(self, buffer: memoryview) -> None:
        self._registered.remove(buffer)
        rc = self._client().unregister_buffer(_address(buffer))
        if rc != 0:
            raise BenchError(f"mooncake unregister_buffer returned {rc}")

    @override
    def apis(self, op: str, batched: bool) -> tuple[str, ...]:
        return _APIS[(op, batched)]

    @override
    def put(self, key: str, value: memoryview) -> None:
        if self.api("put", False) == "put_from":
            rc = self._client().put_from(key, _address(value), len(value))
        else:
            rc = self._client().put(key, value)
        if rc != 0:
            raise BenchError(f"mooncake {self.api('put', False)} {key!r} returned {rc}")

    @override
    def get(self, key: str, out: memoryview) -> Read:
        if self.api("get", False) == "get_into":
            n = self._client().get_into(key, _address(out), len(out))
            if n < 0:
                raise BenchError(f"mooncake get_into {key!r} returned {n}")
            return out[:n]
        value = self._client().get(key)
        if not isinstance(value, bytes) or not value:  # b"" is how Mooncake says "failed"
            raise BenchError(f"mooncake get {key!r}: miss or error (it returned b'')")
        return value

    @override
    def batch_put(self, keys: Sequence[str], values: Sequence[memoryview]) -> None:
        if self.api("put", True) == "batch_put_from":
            codes = self._client().batch_put_from(
                list(keys), [_address(v) for v in values], [len(v) for v in values]
            )
            if len(codes) != len(keys) or any(c != 0 for c in codes):
                raise BenchError(f"mooncake batch_put_from returned {codes[:4]}...")
            return
        rc = self._client().put_batch(list(keys), list(values))
        if rc != 0:
            raise BenchError(f"mooncake put_batch returned {rc}")

    @override
    def batch_get(self, keys: Sequence[str], outs: Sequence[memoryview]) -> list[Read]:
        if self.api("get", True) == "batch_get_into":
            sizes = self._client().batch_get_into(
                list(keys), [_address(o) for o in outs], [len(o) for o in outs]
            )
            if len(sizes) != len(keys) or any(n < 0 for n in sizes):
                raise BenchError(f"mooncake batch_get_into returned {sizes[:4]}...")
            return [out[:n] for out, n in zip(outs, sizes, strict=True)]
        values = self._client().get_batch(list(keys))
        if len(values) != len(keys) or not all(values):
            failed = [k for k, v in zip(keys, values, strict=False) if not v]
            raise BenchError(f"mooncake get_batch failed for {len(failed) or len(keys)} keys")
        return list(values)

    @override
    def reset(self) -> None:
        # force: every get granted a lease (10 s), and a leased object is not removable otherwise
        rc = self._client().remove_all(True)
        if rc < 0:
            raise BenchError(f"mooncake remove_all returned {rc}")

    @override
    def teardown(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()
        self._registered.clear()
        # The node leaves first (it unmounts at the master), then the servers.
        while self._children:
            self._children.pop().stop()


def _address(buffer: memoryview) -> int:
    """Where `buffer` starts in memory (Mooncake's zero-copy calls take raw addresses)."""
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)


def _node(master: str, metadata: str, segment_size: int) -> int:
    """A process that only contributes a segment; leaves when its stdin closes."""
    store = _import_store()()
    rc = store.setup("127.0.0.1", metadata, segment_size, 16 << 20, "tcp", "", master)
    if rc != 0:
        print(f"mooncake node setup failed: {rc}", flush=True)
        return 1
    try:
        print(f"mooncake node ready {store.get_hostname()}", flush=True)
        sys.stdin.read()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "node":
        sys.exit("usage: python -m kvpool.bench.peers.mooncake_peer node MASTER METADATA SIZE")
    sys.exit(_node(sys.argv[2], sys.argv[3], int(sys.argv[4])))
