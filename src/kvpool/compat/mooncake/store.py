"""`MooncakeDistributedStore` on a kvpool pool: Mooncake's Python API, call by call.

Every method is built on the native `kvpool.client.Store` and answers the way the real
`mooncake.store.MooncakeDistributedStore` (wheel 0.3.13) answers; docs/compat.md lists the
answers call by call, and the suite in tests/compat checks both side by side:

* ints, never exceptions: 0 for success, a negative `ErrorCode` (Mooncake's numbers) for
  failure, byte counts from `get_into` / `batch_get_into`, 1/0 from `is_exist`, counts from
  `remove_all` / `remove_by_regex`; `get` answers b"" on any failure, `get_buffer` None;
* reads and exist checks grant the master's read lease, so `remove` right after a read
  answers -706 unless forced;
* the only exceptions are the ones Python-level misuse raises in Mooncake too: TypeError for an
  argument of the wrong type, RuntimeError for a multi-dimensional part of `put_parts` (and for
  the disk descriptor of a memory replica).

Where Mooncake crashes (most calls before `setup()` or after `close()` segfault it), every call
answers UNAVAILABLE_IN_CURRENT_STATUS (-1010), `get` b"", `health_check` 1, `close` 0.

The class is assembled from one class per family of calls, each saying what differs from the
native Store: writes.py (puts), reads.py (gets), replicas.py (replica descriptors and tasks),
sessions.py (put and get sessions), segments.py (segments mounted after setup), tensor.py
(tensor objects); this module adds setup, close, existence checks and removal. base.py holds the
state they share, calls.py the argument checks and the one decorator that turns faults into
answers.

Thread-safe like the native Store: calls may come from any thread; `close()` makes calls in
flight answer an error code.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from typing import Any, Final

import numpy as np

from kvpool.client import Store
from kvpool.codes import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    OBJECT_NOT_FOUND,
    OK,
    RPC_FAIL,
    RPC_TIMEOUT,
)
from kvpool.compat.mooncake import names
from kvpool.compat.mooncake.calls import answers, check_key, check_keys, index, one_code, per_key
from kvpool.compat.mooncake.config import store_hot_cache_size, store_read_mode
from kvpool.compat.mooncake.dummy import DummyLink
from kvpool.compat.mooncake.memory import MooncakeHostMemAllocator
from kvpool.compat.mooncake.reads import Reads
from kvpool.compat.mooncake.replicas import Replicas
from kvpool.compat.mooncake.segments import PAGE, MountedSegments, SegmentCalls
from kvpool.compat.mooncake.sessions import SessionCalls, Sessions
from kvpool.compat.mooncake.setup import (
    SetupParams,
    from_dict,
    from_positional,
    pool_master_address,
    split_hostname,
)
from kvpool.compat.mooncake.tensor_parallel import TensorParallelCalls
from kvpool.compat.mooncake.writes import Writes
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["MooncakeDistributedStore"]

log = logging.getLogger(__name__)

INIT_ALL_BUFFER: Final = 1 << 30
"""init_all's local buffer size in Mooncake (1 GiB, fixed by the wheel)."""


class MooncakeDistributedStore(
    Writes, Reads, Replicas, SessionCalls, SegmentCalls, TensorParallelCalls
):
    """Mooncake's store API on a kvpool pool (see the module docstring).

    ::

        store = MooncakeDistributedStore()
        store.setup("127.0.0.1", "P2PHANDSHAKE", 512 << 20, 128 << 20, "tcp", "",
                    "127.0.0.1:50051")
        store.put("key", b"value")
        store.get("key")          # b"value"
        store.close()
    """

    def __init__(self) -> None:
        super().__init__()
        self._params: SetupParams | None = None
        self._sessions = Sessions()
        self._mounted = MountedSegments(self._forget_segment)
        # alloc_from_mem_pool's blocks: registered for the pointer calls, freed by close().
        self._pool = MooncakeHostMemAllocator()
        self._pool_blocks: list[tuple[int, int]] = []
        self._name_port: socket.socket | None = None
        self._pool_limit = 0
        self._link: DummyLink | None = None

    # ------------------------------------------------------------------ setup / close

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """Connect to the master and contribute `global_segment_size` bytes; 0 or a negative
        code. Both of Mooncake's forms: seven positional arguments (plus optional ones), or
        one dict."""
        if len(args) == 1 and not kwargs and isinstance(args[0], Mapping):
            parse: Callable[[], SetupParams] = lambda: from_dict(args[0])  # noqa: E731
        elif not args and set(kwargs) == {"config"} and isinstance(kwargs["config"], Mapping):
            parse = lambda: from_dict(kwargs["config"])  # noqa: E731
        else:
            parse = lambda: from_positional(*args, **kwargs)  # noqa: E731
        try:
            params = parse()
        except (InvalidParams, ValueError) as exc:
            log.error("setup: %s", exc)
            return INVALID_PARAMS
        with self._lock:
            if self._store is not None:
                log.warning("setup: this store is already set up; the new arguments are ignored")
                return OK
            try:
                self._open(params)
            except KVPoolError as exc:
                log.error("setup: cannot join the pool at %s: %s", params.master_server_addr, exc)
                # Mooncake answers an unreachable master with INTERNAL_ERROR (after ~90 s).
                return INTERNAL_ERROR if exc.code in (RPC_FAIL, RPC_TIMEOUT) else int(exc.code)
            except Exception as exc:  # a setup that raises would break Mooncake's contract
                log.error("setup: %s", exc, exc_info=not isinstance(exc, OSError))
                return INTERNAL_ERROR
        return OK

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        """Mooncake's legacy setup: `setup("localhost:12345", "127.0.0.1:2379",
        mount_segment_size, 1 GiB, protocol, device_name, "127.0.0.1:50051")`, so a master on
        127.0.0.1:50051; -600 when this store is already set up."""
        if not isinstance(protocol, str) or not isinstance(device_name, str):
            raise TypeError("init_all(protocol: str, device_name: str, mount_segment_size: int)")
        size = index(mount_segment_size)
        if self._store is not None:
            log.error("init_all: this store is already set up")
            return INVALID_PARAMS
        return self.setup(
            "localhost:12345",
            "127.0.0.1:2379",
            size,
            INIT_ALL_BUFFER,
            protocol,
            device_name,
            "127.0.0.1:50051",
        )

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Attach to the standalone client serving `server_address` (`mooncake_client`, or
        `python -m kvpool.compat.mooncake_client`) and join the pool it serves, contributing no
        memory: the host's memory is the standalone client's segment. `alloc_from_mem_pool`
        hands out registered memory from a pool of `mem_pool_size` bytes. 0, or -1 when no
        standalone client serves the address (as Mooncake). The dummy survives a restart of
        the standalone client (it re-attaches in the background)."""
        pool, buffer = index(mem_pool_size), index(local_buffer_size)
        if not isinstance(server_address, str):
            raise TypeError("server_address: expected str")
        if pool < 0 or buffer < 0:
            log.error("setup_dummy: negative sizes (%d, %d)", pool, buffer)
            return INVALID_PARAMS
        if self._store is not None:
            log.warning("setup_dummy: this store is already set up; the new arguments are ignored")
            return OK
        link = DummyLink(server_address)
        try:
            info = link.attach()
        except KVPoolError as exc:
            log.error("setup_dummy: %s", exc)
            return INTERNAL_ERROR
        try:
            params = SetupParams(
                local_hostname="127.0.0.1",
                metadata_server="P2PHANDSHAKE",
                global_segment_size=0,
                local_buffer_size=buffer,
                protocol="tcp",
                rdma_devices="",
                master_server_addr=info.master,
                tenant_id=info.tenant,
            )
            with self._lock:
                if self._set_up():  # another thread's setup won meanwhile
                    link.close()
                    return OK
                self._open(params)
                self._link = link
                self._pool_limit = pool
        except KVPoolError as exc:
            link.close()
            log.error("setup_dummy: cannot join the pool at %s: %s", info.master, exc)
            return INTERNAL_ERROR if exc.code in (RPC_FAIL, RPC_TIMEOUT) else int(exc.code)
        except Exception as exc:
            link.close()
            log.error("setup_dummy: %s", exc, exc_info=not isinstance(exc, OSError))
            return INTERNAL_ERROR
        return OK

    def _set_up(self) -> bool:
        return self._store is not None

    def _open(self, p: SetupParams) -> None:
        host, port = split_hostname(p.local_hostname)
        if p.metadata_server.upper() != "P2PHANDSHAKE":
            log.debug("setup: metadata_server %r is not needed by kvpool", p.metadata_server)
        offload_dir: str | None = None
        if p.enable_ssd_offload:
            if p.ssd_offload_path:
                # kvpool's disk tier (docs/parts/tiers.md): a preallocated file there, 4x the
                # segment (at least 1 GiB); the master's --offload-policy decides what goes.
                offload_dir = p.ssd_offload_path
            else:
                log.warning("setup: enable_ssd_offload without ssd_offload_path: no disk tier")
        if p.enable_client_http_server:
            log.warning("setup: the client HTTP server is not supported; use `kvpool status`")
        if p.protocol != "tcp":
            log.info("setup: protocol %r: kvpool chooses memcpy, shm or TCP by itself", p.protocol)
        segment = p.global_segment_size
        if 0 < segment < PAGE:
            segment = PAGE
        store = Store(
            pool_master_address(p.master_server_addr),
            segment_size=segment,
            local_buffer_size=p.local_buffer_size,
            host=host,
            # Named by its transfer server's port (below), taken from Mooncake's range as its
            # TransferEngine takes its RPC port, so that `get_hostname()` parses as Mooncake's.
            transfer_port_range=None if port is not None else (NAME_PORTS[0], NAME_PORTS[-1]),
            tenant=p.tenant_id,
            # Mooncake's "tcp" means "no RDMA" and still copies locally when it can; kvpool's
            # "auto" is the same idea plus shared memory between processes of one host.
            protocol="auto",
            offload_dir=offload_dir,
            offload_size=max(4 * segment, 1 << 30) if offload_dir is not None else 0,
            read_mode=(mode := store_read_mode()),  # opt-in: MC_STORE_READ_MODE=cached
            hot_cache_size=store_hot_cache_size(mode),  # MC_STORE_LOCAL_HOT_CACHE_SIZE
        )
        segments = store.segments
        reserved = None
        if port is None:
            port = _endpoint_port(segments)
        if port is None:
            # A pure client: named, as in Mooncake, by a port of MC_STORE_CLIENT_MIN_PORT..
            # MAX_PORT, held bound (never listening) so no other store of this host takes it.
            reserved = _reserve_name_port()
            port = int(reserved.getsockname()[1])
        hostname = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        staging = None
        if p.local_buffer_size > 0:
            staging = np.empty(p.local_buffer_size, dtype=np.uint8)
            try:
                store.register_buffer(staging)
            except BaseException:
                store.close()
                if reserved is not None:
                    reserved.close()
                raise
        names.open_store(hostname, segments)
        self._staging = staging
        self._store, self._params = store, p
        self._hostname = hostname
        self._buffer_size = p.local_buffer_size
        self._pool_limit = p.local_buffer_size
        self._name_port = reserved

    def close(self) -> int:
        """Unmount this store's segment and disconnect; 0, also when not set up. Idempotent."""
        with self._lock:
            store, self._store = self._store, None
            hostname = self._hostname
        if store is None:
            return OK
        names.forget_store(hostname)
        self._pointers.clear()
        self._sessions.clear()
        self._mounted.close()
        self._staging = None
        try:
            store.close()
        except KVPoolError as exc:
            log.warning("close: %s", exc)
        # Graceful unmounts still draining end now that their Store is closed.
        self._mounted.wait(DRAIN_JOIN_S)
        with self._lock:
            blocks, self._pool_blocks = self._pool_blocks, []
            reserved, self._name_port = self._name_port, None
            link, self._link = self._link, None
        if link is not None:
            link.close()
        for address, _ in blocks:
            self._pool.free(address)
        if reserved is not None:
            reserved.close()
        return OK

    def alloc_from_mem_pool(self, size: int) -> int:
        """The address of `size` bytes of page-aligned host memory, registered for the pointer
        calls (`put_from`, `get_into`, ...) as Mooncake's dummy clients get it from their shared
        pool; 0 when not set up, for a size that is not positive, or once the pool is used up
        (its size is `local_buffer_size`, or `mem_pool_size` after `setup_dummy`). The memory stays until `close()`."""
        n = index(size)
        with self._lock:
            if self._store is None or n <= 0:
                return 0
            used = sum(b for _, b in self._pool_blocks)
            if used + n > self._pool_limit:
                log.error(
                    "alloc_from_mem_pool(%d): the pool has %d of %d bytes left",
                    n,
                    self._pool_limit - used,
                    self._pool_limit,
                )
                return 0
            address = self._pool.alloc(n)
            if address == 0:
                return 0
            if self._register(address, n) != OK:
                self._pool.free(address)
                return 0
            self._pool_blocks.append((address, n))
        return address

    def get_offload_rpc_read_count(self) -> int:
        """Reads of this client's disk tier (`enable_ssd_offload`) that its transfer server
        served other clients (Mooncake's offload RPC reads); 0 without a disk tier, as in
        Mooncake, or before setup."""
        store = self._store
        served = store.served if store is not None and store.disk_tier is not None else None
        return served.tier_reads if served is not None else 0

    def get_hostname(self) -> str:
        """This store's "host:port" (its segment name in Mooncake); "" before setup."""
        return self._hostname if self._store is not None else ""

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable (Mooncake's numbers)."""
        store = self._store
        if store is None:
            return 1
        try:
            return int(store.health_check())
        except KVPoolError:
            return 2

    # ------------------------------------------------------------------ queries

    def is_exist(self, key: str) -> int:
        """1 if `key` exists, 0 if not, or a code (grants a read lease, as Mooncake)."""
        return self._is_exist(check_key(key))

    @answers(one_code)
    def _is_exist(self, store: Store, key: str) -> int:
        return int(store.exists(key)) if key else 0

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return self._batch_is_exist(check_keys(keys))

    @answers(per_key)
    def _batch_is_exist(self, store: Store, keys: list[str]) -> list[int]:
        valid = [i for i, k in enumerate(keys) if k]
        got = store.batch_exists([keys[i] for i in valid]) if valid else []
        out = [0] * len(keys)
        for i, e in zip(valid, got, strict=True):
            out[i] = int(e)
        return out

    def get_size(self, key: str) -> int:
        """The value's size in bytes, or a code (-704 when missing)."""
        return self._get_size(check_key(key))

    @answers(one_code)
    def _get_size(self, store: Store, key: str) -> int:
        return store.get_size(key) if key else OBJECT_NOT_FOUND

    # ------------------------------------------------------------------ remove

    def remove(self, key: str, force: bool = False) -> int:
        """0, -704 when missing, -706 while a reader's lease lasts (unless `force`)."""
        return self._remove(check_key(key), bool(force))

    @answers(one_code)
    def _remove(self, store: Store, key: str, force: bool) -> int:
        if not key:
            return OBJECT_NOT_FOUND
        store.remove(key, force)
        return OK

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        return self._batch_remove(check_keys(keys), bool(force))

    @answers(per_key)
    def _batch_remove(self, store: Store, keys: list[str], force: bool) -> list[int]:
        valid = [i for i, k in enumerate(keys) if k]
        got = store.batch_remove([keys[i] for i in valid], force) if valid else []
        out = [OBJECT_NOT_FOUND] * len(keys)
        for i, c in zip(valid, got, strict=True):
            out[i] = int(c)
        return out

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Remove the keys the pattern is found in; the count removed (leased keys are skipped
        unless `force`), or -600 for a bad pattern."""
        if not isinstance(regex_pattern, str):
            raise TypeError("regex_pattern: expected str")
        return self._remove_by_regex(regex_pattern, bool(force))

    @answers(one_code)
    def _remove_by_regex(self, store: Store, pattern: str, force: bool) -> int:
        return store.remove_by_regex(pattern, force)

    def remove_all(self, force: bool = False) -> int:
        """Remove every object of this tenant (leased ones only with `force`); the count."""
        return self._remove_all(bool(force))

    @answers(one_code)
    def _remove_all(self, store: Store, force: bool) -> int:
        return store.remove_all(force)


def _endpoint_port(segments: list[str]) -> int | None:
    """The port of this store's transfer server, from its segment name "host:port/n"."""
    for name in segments:
        endpoint = name.rsplit("/", 1)[0]
        _, _, port = endpoint.rpartition(":")
        if port.isdigit():
            return int(port)
    return None


DRAIN_JOIN_S: Final = 5.0
"""Seconds `close()` waits for the threads of graceful unmounts to notice the closed Store."""

NAME_PORTS: Final = range(12300, 14301)
"""Mooncake's client port range (MC_STORE_CLIENT_MIN_PORT 12300 .. MAX_PORT 14300): the port
of `get_hostname()`, a reserved one for a store that serves no segment, its transfer server's
for one that does."""


def _reserve_name_port() -> socket.socket:
    """A socket bound (not listening) on 127.0.0.1 to a free port of `NAME_PORTS`, tried in
    random order as Mooncake does; an ephemeral port when the whole range is taken."""
    import random

    candidates = list(NAME_PORTS)
    random.shuffle(candidates)
    for port in [*candidates, 0]:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        if port == 0:
            log.warning("setup: every port of %d..%d is taken", NAME_PORTS[0], NAME_PORTS[-1])
        return s
    raise KVPoolError("setup: no free port for the store's name")
