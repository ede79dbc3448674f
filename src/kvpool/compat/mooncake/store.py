"""`MooncakeDistributedStore` on a kvpool pool: Mooncake's Python API, call by call.

Every method is built on the native `kvpool.client.Store` and answers the way the real
`mooncake.store.MooncakeDistributedStore` (wheel 0.3.13) answers (reference/mooncake-store.md
§1 and §7.3; the suite in tests/compat checks both side by side):

* ints, never exceptions: 0 for success, a negative `ErrorCode` (Mooncake's numbers) for
  failure, byte counts from `get_into` / `batch_get_into`, 1/0 from `is_exist`, counts from
  `remove_all` / `remove_by_regex`; `get` answers b"" on any failure, `get_buffer` None;
* a put of an existing key answers 0 and keeps the old value; `upsert*` overwrites;
* reads and exist checks grant the master's read lease, so `remove` right after a read
  answers -706 unless forced;
* copying puts go through a staging buffer of `local_buffer_size` bytes in Mooncake, so a
  value larger than it answers -600; kvpool needs no staging buffer but keeps that limit so a
  program sees the same answers;
* raw-pointer calls (`register_buffer(ptr, size)`, `put_from`, `get_into`, their batch and
  multi-buffer forms) accept only ranges inside registered memory (`memory.PointerRegistry`);
  anything else answers -600 and is never dereferenced (the real wheel copies from any
  address on its TCP path);
* replica descriptors, copy/move tasks and `query_task` answer the wheel's shapes
  (descriptors.py): task ids are `(high, low)` pairs, refusals `((0, 0), code)`, segments are
  named as stores name them (`get_hostname()`); put and get sessions and their ranged calls
  are kept per store (sessions.py);
* segments mounted after setup (`mount_segment` over a caller's file,
  `allocate_and_mount_segment`) and their unmounts answer the wheel's dicts and codes
  (segments.py, which also says how a graceful unmount differs);
* the only exceptions are the ones Python-level misuse raises in Mooncake too: TypeError for an
  argument of the wrong type, RuntimeError for a multi-dimensional part of `put_parts` (and for
  the disk descriptor of a memory replica).

Where Mooncake crashes (most calls before `setup()` or after `close()` segfault it), every call
answers UNAVAILABLE_IN_CURRENT_STATUS (-1010), `get` b"", `health_check` 1, `close` 0.

Segment names: Mooncake names a store's segment after the store ("host:port", what
`get_hostname()` returns) and `ReplicateConfig.preferred_segments` uses those names. kvpool
names segments "<transfer endpoint>/<n>"; `preferred_segments` given in Mooncake's form are
translated (stores of this process exactly, other processes by that convention).

Thread-safe like the native Store: calls may come from any thread; `close()` makes calls in
flight answer an error code.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import numpy as np

from kvpool.client import Store
from kvpool.compat.mooncake import tensor as tensor_format
from kvpool.compat.mooncake.descriptors import (
    NO_ID,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    QueryTaskResponse,
    ReplicaDescriptor,
    uuid_hex,
    uuid_pair,
)
from kvpool.compat.mooncake.memory import BufferHandle, PointerRegistry
from kvpool.compat.mooncake.replicate import ReplicaStatus, ReplicateConfig, TaskStatus, TaskType
from kvpool.compat.mooncake.segments import Kind, MountedSegments
from kvpool.compat.mooncake.sessions import Sessions, copy_from_ranges, copy_into_ranges
from kvpool.compat.mooncake.setup import SetupParams, from_dict, from_positional, split_hostname
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError
from kvpool.protocol.messages import ReplicaDesc, ReplicaKind

__all__ = ["MooncakeDistributedStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

OK: Final = 0
UNAVAILABLE: Final = int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)
INVALID: Final = int(ErrorCode.INVALID_PARAMS)
NOT_FOUND: Final = int(ErrorCode.OBJECT_NOT_FOUND)
INTERNAL: Final = int(ErrorCode.INTERNAL_ERROR)
EXISTS: Final = ErrorCode.OBJECT_ALREADY_EXISTS
NOT_SUPPORTED: Final = int(ErrorCode.NOT_SUPPORTED)
NOT_READY: Final = int(ErrorCode.REPLICA_IS_NOT_READY)
NO_RANGES: Final = int(ErrorCode.INVALID_REPLICA)
INIT_ALL_BUFFER: Final = 1 << 30
"""init_all's local buffer size in Mooncake (RealClient::initAll_internal)."""
KVPOOL_MIN_SEGMENT: Final = 4096
"""kvpool segments are mmap'ed: Mooncake's 1 KiB minimum is rounded up to a page."""

_DEFAULT_CONFIG = ReplicateConfig()

# Mooncake hostname ("host:port") of each store open in this process → its kvpool segments.
_local_segments: dict[str, list[str]] = {}
_local_lock = threading.Lock()


def _segment_names(names: list[str]) -> list[str]:
    """kvpool segment names for Mooncake ones (see the module docstring)."""
    out: list[str] = []
    with _local_lock:
        for name in names:
            if name in _local_segments:
                out.extend(_local_segments[name])
            elif "/" in name:
                out.append(name)  # already a kvpool name
            else:
                out.append(f"{name}/0")
    return out


def _mooncake_segment(segment: str) -> str:
    """The Mooncake name of a kvpool segment: the inverse of `_segment_names` (a store of
    this process → its hostname, "<endpoint>/0" → "<endpoint>", anything else unchanged)."""
    with _local_lock:
        for hostname, segments in _local_segments.items():
            if segment in segments:
                return hostname
    endpoint, _, n = segment.rpartition("/")
    return endpoint if endpoint and n == "0" else segment


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key: expected str, got {type(key).__name__}")
    return key


def _check_keys(keys: object) -> list[str]:
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(f"keys: expected a list of str, got {type(keys).__name__}")
    return [_check_key(k) for k in keys]


def _view(value: object) -> memoryview:
    """A byte view of `value` (TypeError without the buffer protocol, as pybind11's Buffer)."""
    mv = memoryview(value)  # type: ignore[arg-type]  # raises TypeError for non-buffers
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B") if mv.c_contiguous else mv
    return mv


def _ptr(value: object) -> int:
    return operator.index(value)  # type: ignore[arg-type]  # TypeError for non-integers


def _code(exc: BaseException) -> int:
    if isinstance(exc, KVPoolError):
        return int(exc.code)
    log.error("unexpected error in the Mooncake compatibility layer", exc_info=exc)
    return INTERNAL


def _first_occurrences(keys: list[str]) -> tuple[list[int], dict[int, int]]:
    """Indices of each key's first occurrence, and later duplicates → their first index.

    Mooncake writes a key named twice in one batch once, the first value, and answers the
    same for both (checked against the wheel); kvpool's Store refuses such batches.
    """
    first: dict[str, int] = {}
    order: list[int] = []
    dup: dict[int, int] = {}
    for i, k in enumerate(keys):
        j = first.setdefault(k, i)
        if j == i:
            order.append(i)
        else:
            dup[i] = j
    return order, dup


class MooncakeDistributedStore:
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
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._params: SetupParams | None = None
        self._hostname = ""
        self._buffer_size = 0
        self._pointers = PointerRegistry()
        self._sessions = Sessions()
        self._mounted = MountedSegments(self._forget_segment)
        # The read side of Mooncake's local buffer: `get` reads into it and copies out once.
        # Reading into fresh memory instead (the native Store's `get`) and then copying into
        # the `bytes` Mooncake returns touches two fresh allocations per call, and first-touch
        # page faults made a 16 MiB `get` 5-10x slower here. Allocated untouched (numpy.empty):
        # pages are faulted in by the first reads that need them, then stay warm.
        self._staging: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self._staging_lock = threading.Lock()

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
            return INVALID
        with self._lock:
            if self._store is not None:
                log.warning("setup: this store is already set up; the new arguments are ignored")
                return OK
            try:
                self._open(params)
            except KVPoolError as exc:
                log.error("setup: cannot join the pool at %s: %s", params.master_server_addr, exc)
                # Mooncake answers an unreachable master with INTERNAL_ERROR (after ~90 s).
                return (
                    INTERNAL
                    if exc.code in (ErrorCode.RPC_FAIL, ErrorCode.RPC_TIMEOUT)
                    else int(exc.code)
                )
            except Exception as exc:  # a setup that raises would break Mooncake's contract
                log.error("setup: %s", exc, exc_info=not isinstance(exc, OSError))
                return INTERNAL
        return OK

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        """Mooncake's legacy setup: `setup("localhost:12345", "127.0.0.1:2379",
        mount_segment_size, 1 GiB, protocol, device_name, "127.0.0.1:50051")`, so a master on
        127.0.0.1:50051; -600 when this store is already set up."""
        if not isinstance(protocol, str) or not isinstance(device_name, str):
            raise TypeError("init_all(protocol: str, device_name: str, mount_segment_size: int)")
        size = _ptr(mount_segment_size)
        if self._store is not None:
            log.error("init_all: this store is already set up")
            return INVALID
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
        """Not supported: Mooncake's dummy client forwards every call to a separate
        `mooncake_client` process, which kvpool does not have (a kvpool store talks to the
        master itself); answers NOT_SUPPORTED (-1012). Use `setup()`."""
        for n in (mem_pool_size, local_buffer_size):
            _ptr(n)  # TypeError for a non-integer, as pybind11
        if not isinstance(server_address, str):
            raise TypeError("server_address: expected str")
        log.error(
            "setup_dummy(%r): kvpool has no mooncake_client process to attach to; use setup()",
            server_address,
        )
        return NOT_SUPPORTED

    def _open(self, p: SetupParams) -> None:
        host, port = split_hostname(p.local_hostname)
        if p.metadata_server.upper() != "P2PHANDSHAKE":
            log.debug("setup: metadata_server %r is not needed by kvpool", p.metadata_server)
        if p.enable_ssd_offload:
            log.warning("setup: enable_ssd_offload is not supported by this compatibility layer")
        if p.enable_client_http_server:
            log.warning("setup: the client HTTP server is not supported; use `kvpool status`")
        if p.protocol != "tcp":
            log.info("setup: protocol %r: kvpool chooses memcpy, shm or TCP by itself", p.protocol)
        segment = p.global_segment_size
        if 0 < segment < KVPOOL_MIN_SEGMENT:
            segment = KVPOOL_MIN_SEGMENT
        store = Store(
            p.master_server_addr,
            segment_size=segment,
            local_buffer_size=p.local_buffer_size,
            host=host,
            tenant=p.tenant_id,
            # Mooncake's "tcp" means "no RDMA" and still copies locally when it can; kvpool's
            # "auto" is the same idea plus shared memory between processes of one host.
            protocol="auto",
        )
        segments = store.segments
        if port is None:
            port = _endpoint_port(segments) or _any_free_port()
        hostname = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        staging = None
        if p.local_buffer_size > 0:
            staging = np.empty(p.local_buffer_size, dtype=np.uint8)
            try:
                store.register_buffer(staging)
            except BaseException:
                store.close()
                raise
        with _local_lock:
            _local_segments[hostname] = segments
        self._staging = staging
        self._store, self._params = store, p
        self._hostname = hostname
        self._buffer_size = p.local_buffer_size

    def close(self) -> int:
        """Unmount this store's segment and disconnect; 0, also when not set up. Idempotent."""
        with self._lock:
            store, self._store = self._store, None
            hostname = self._hostname
        if store is None:
            return OK
        with _local_lock:
            _local_segments.pop(hostname, None)
        self._pointers.clear()
        self._sessions.clear()
        self._mounted.close()
        self._staging = None
        try:
            store.close()
        except KVPoolError as exc:
            log.warning("close: %s", exc)
        return OK

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

    # ------------------------------------------------------------------ segments

    def mount_segment(
        self, path: str, size: int, offset: int = 0, protocol: str = "tcp", location: str = ""
    ) -> dict[str, Any]:
        """Mount bytes [offset, offset + size) of the file (or /dev/shm file) at `path` as one
        more segment of this store: `{"ret": 0, "segment_ids": [id]}`; size 0 mounts nothing
        (ret 0, no ids); a file that cannot be opened, a range past its end, an offset that is
        not page-aligned, or a size under one page answer ret -1. `protocol` and `location`
        are accepted and not needed."""
        _check_str(path, "path")
        nbytes, off = _unsigned(size, "size"), _unsigned(offset, "offset")
        _check_str(protocol, "protocol")
        _check_str(location, "location")
        store = self._store
        if store is None:
            return {"ret": UNAVAILABLE, "segment_ids": []}
        if nbytes == 0:
            return {"ret": OK, "segment_ids": []}
        try:
            name = store.mount_segment(nbytes, path=path, offset=off)
        except Exception as exc:
            log.error("mount_segment(%r, %d, %d): %s", path, nbytes, off, exc)
            return {"ret": INTERNAL, "segment_ids": []}
        self._adopt_segment(name, Kind.FILE)
        return {"ret": OK, "segment_ids": [name]}

    def allocate_and_mount_segment(
        self, size: int, protocol: str = "tcp", location: str = ""
    ) -> dict[str, Any]:
        """Allocate `size` bytes (rounded up to a page; Mooncake rounds to 16 MiB) and mount
        them as one more segment: `{"ret": 0, "segment_ids": [id], "allocated_size": n}`;
        size 0 or a failed allocation answer ret -1."""
        nbytes = _unsigned(size, "size")
        _check_str(protocol, "protocol")
        _check_str(location, "location")
        store = self._store
        if store is None:
            return {"ret": UNAVAILABLE, "segment_ids": [], "allocated_size": 0}
        rounded = -(-nbytes // KVPOOL_MIN_SEGMENT) * KVPOOL_MIN_SEGMENT
        try:
            if rounded == 0:
                raise InvalidParams("size is 0")
            name = store.mount_segment(rounded)
        except Exception as exc:
            log.error("allocate_and_mount_segment(%d): %s", nbytes, exc)
            return {"ret": INTERNAL, "segment_ids": [], "allocated_size": 0}
        self._adopt_segment(name, Kind.ALLOCATED)
        return {"ret": OK, "segment_ids": [name], "allocated_size": rounded}

    def unmount_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        """Unmount segments of `mount_segment`, in order; 0, or the first failure (-1 for an id
        this store did not mount that way, -600 for one already being unmounted gracefully).
        A grace period answers at once and unmounts when it ends (segments.py)."""
        return self._unmount(segment_ids, grace_period_seconds, Kind.FILE)

    def unmount_and_free_segment(
        self, segment_ids: list[str], grace_period_seconds: int = 0
    ) -> int:
        """`unmount_segment` for the segments of `allocate_and_mount_segment`."""
        return self._unmount(segment_ids, grace_period_seconds, Kind.ALLOCATED)

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """0: a kvpool store has no local disk segment (the wheel answers 0 without one)."""
        _unsigned(grace_period_seconds, "grace_period_seconds")
        return OK if self._store is not None else UNAVAILABLE

    def _unmount(self, segment_ids: object, grace: object, kind: Kind) -> int:
        if isinstance(segment_ids, str) or not isinstance(segment_ids, Sequence):
            raise TypeError(f"segment_ids: expected a list of str, got {type(segment_ids)}")
        ids = [_check_str(sid, "segment_ids") for sid in segment_ids]
        grace_s = _unsigned(grace, "grace_period_seconds")
        store = self._store
        if store is None:
            return UNAVAILABLE
        return self._mounted.unmount(store, ids, kind, grace_s)

    def _adopt_segment(self, name: str, kind: Kind) -> None:
        self._mounted.add(name, kind)
        # preferred_segments=[hostname] and replica descriptors name it after this store.
        with _local_lock:
            names = _local_segments.get(self._hostname)
            if names is not None and name not in names:
                names.append(name)

    def _forget_segment(self, name: str) -> None:
        with _local_lock:
            names = _local_segments.get(self._hostname)
            if names is not None and name in names:
                names.remove(name)

    # ------------------------------------------------------------------ helpers

    def _run(self, op: Callable[[Store], int]) -> int:
        store = self._store
        if store is None:
            return UNAVAILABLE
        try:
            return op(store)
        except Exception as exc:
            return _code(exc)

    def _run_list(self, n: int, op: Callable[[Store], list[int]]) -> list[int]:
        store = self._store
        if store is None:
            return [UNAVAILABLE] * n
        try:
            return op(store)
        except Exception as exc:
            return [_code(exc)] * n

    def _native(self, config: ReplicateConfig | None) -> Any:
        cfg = _DEFAULT_CONFIG if config is None else config
        if not isinstance(cfg, ReplicateConfig):
            raise TypeError(f"config: expected a ReplicateConfig, got {type(cfg).__name__}")
        return cfg.to_native(_segment_names)

    def _staged(self, nbytes: int) -> None:
        if nbytes > self._buffer_size:
            raise InvalidParams(
                f"{nbytes} bytes do not fit the local buffer of {self._buffer_size} bytes "
                "(Mooncake's staging limit, kept for compatibility)"
            )

    # ------------------------------------------------------------------ put

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Insert `value` unless `key` exists (then 0, old value kept)."""
        return self._put(_check_key(key), _view(value), config, upsert=False)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Insert or overwrite."""
        return self._put(_check_key(key), _view(value), config, upsert=True)

    def _put(
        self, key: str, mv: memoryview, config: ReplicateConfig | None, *, upsert: bool
    ) -> int:
        def op(store: Store) -> int:
            native = self._native(config)
            self._staged(mv.nbytes)
            if upsert:
                store.upsert(key, mv, native)
            else:
                store.put(key, mv, native)
            return OK

        return self._run(op)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """One object from several 1-D byte buffers, concatenated."""
        return self._put(_check_key(key), _join_parts(parts), config, upsert=False)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._put(_check_key(key), _join_parts(parts), config, upsert=True)

    def put_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        """Put every pair; the first failure's code (partial success is possible), else 0."""
        return self._put_batch(keys, values, config, upsert=False)

    def upsert_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        return self._put_batch(keys, values, config, upsert=True)

    def _put_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None, *, upsert: bool
    ) -> int:
        ks = _check_keys(keys)
        views = [_view(v) for v in values]

        def op(store: Store) -> int:
            if len(ks) != len(views):
                raise InvalidParams(f"{len(ks)} keys but {len(views)} values")
            if not ks:
                return OK
            native = self._native(config)
            self._staged(sum(mv.nbytes for mv in views))
            codes = self._batch_write(store, ks, views, native, upsert=upsert, zero_copy=False)
            return next((c for c in codes if c != OK), OK)

        return self._run(op)

    @staticmethod
    def _batch_write(
        store: Store,
        keys: list[str],
        views: list[memoryview],
        native: Any,
        *,
        upsert: bool,
        zero_copy: bool,
    ) -> list[int]:
        """Write a batch through the Store; one Mooncake code per key (exists → 0)."""
        order, dup = _first_occurrences(keys)
        ks = [keys[i] for i in order]
        vs = [views[i] for i in order]
        native = _select_groups(native, order, len(keys))
        if zero_copy:
            codes = store.batch_put_from(ks, vs, native)
        elif upsert:
            codes = store.batch_upsert(ks, vs, native)
        else:
            codes = store.batch_put(ks, vs, native)
        out = [OK] * len(keys)
        for i, c in zip(order, codes, strict=True):
            out[i] = OK if c in (ErrorCode.OK, EXISTS) else int(c)
        for i, j in dup.items():
            out[i] = out[j]
        return out

    # ------------------------------------------------------------------ zero-copy put

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register `size` bytes at `buffer_ptr` for the pointer calls; 0 or -600."""
        ptr, n = _ptr(buffer_ptr), _ptr(size)

        def op(store: Store) -> int:
            reg = self._pointers.add(ptr, n)
            try:
                store.register_buffer(reg.view)
            except BaseException:
                self._pointers.remove(ptr)
                raise
            return OK

        return self._run(op)

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """Undo register_buffer (by its start address); -600 when nothing starts there."""
        ptr = _ptr(buffer_ptr)

        def op(store: Store) -> int:
            reg = self._pointers.remove(ptr)
            store.unregister_buffer(reg.view)
            return OK

        return self._run(op)

    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """Zero-copy put of `size` registered bytes at `buffer_ptr`."""
        return self._put_from(_check_key(key), _ptr(buffer_ptr), _ptr(size), config, False)

    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        return self._put_from(_check_key(key), _ptr(buffer_ptr), _ptr(size), config, True)

    def _put_from(
        self, key: str, ptr: int, size: int, config: ReplicateConfig | None, upsert: bool
    ) -> int:
        def op(store: Store) -> int:
            mv = self._pointers.resolve(ptr, size)
            native = self._native(config)
            if upsert:
                # The native Store has no upsert_from; its upsert copies from the same memory
                # once, straight into the segment.
                store.upsert(key, mv, native)
            else:
                store.put_from(key, mv, native)
            return OK

        return self._run(op)

    def put_from_with_metadata(  # noqa: PLR0917  (Mooncake's signature)
        self,
        key: str,
        buffer_ptr: int,
        metadata_buffer_ptr: int,
        size: int,
        metadata_size: int,
        config: ReplicateConfig | None = None,
    ) -> int:
        """One object: `metadata_size` bytes at `metadata_buffer_ptr`, then `size` at
        `buffer_ptr` (both registered)."""
        k = _check_key(key)
        data, meta = _ptr(buffer_ptr), _ptr(metadata_buffer_ptr)
        n, m = _ptr(size), _ptr(metadata_size)

        def op(store: Store) -> int:
            parts = [self._pointers.resolve(meta, m), self._pointers.resolve(data, n)]
            store.put(k, b"".join(parts), self._native(config))
            return OK

        return self._run(op)

    def batch_put_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Zero-copy put per key; one code per key."""
        return self._batch_put_from(keys, buffer_ptrs, sizes, config, upsert=False)

    def batch_upsert_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        return self._batch_put_from(keys, buffer_ptrs, sizes, config, upsert=True)

    def _batch_put_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None,
        *,
        upsert: bool,
    ) -> list[int]:
        ks = _check_keys(keys)
        ptrs, ns = [_ptr(p) for p in buffer_ptrs], [_ptr(s) for s in sizes]

        def op(store: Store) -> list[int]:
            if not len(ks) == len(ptrs) == len(ns):
                return [INVALID] * len(ks)
            native = self._native(config)
            views = [self._pointers.find(p, n) for p, n in zip(ptrs, ns, strict=True)]
            return self._write_resolved(store, ks, views, native, upsert=upsert)

        return self._run_list(len(ks), op)

    def _write_resolved(
        self,
        store: Store,
        keys: list[str],
        views: Sequence[memoryview | None],
        native: Any,
        *,
        upsert: bool,
        zero_copy: bool = True,
    ) -> list[int]:
        """Write the keys whose memory resolved; -600 for the others (and for empty keys)."""
        out = [INVALID] * len(keys)
        good = [(i, v) for i, v in enumerate(views) if v is not None and keys[i]]
        if good:
            codes = self._batch_write(
                store,
                [keys[i] for i, _ in good],
                [v for _, v in good],
                _select_groups(native, [i for i, _ in good], len(keys)),
                upsert=upsert,
                zero_copy=zero_copy and not upsert,
            )
            for (i, _), c in zip(good, codes, strict=True):
                out[i] = c
        return out

    def batch_put_from_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """One object per key, gathered from several registered buffers."""
        ks = _check_keys(keys)
        ptrs = [[_ptr(p) for p in row] for row in all_buffer_ptrs]
        ns = [[_ptr(s) for s in row] for row in all_sizes]

        def op(store: Store) -> list[int]:
            if not len(ks) == len(ptrs) == len(ns):
                return [INVALID] * len(ks)
            views: list[memoryview | None] = []
            for prow, nrow in zip(ptrs, ns, strict=True):
                parts = (
                    [self._pointers.find(p, n) for p, n in zip(prow, nrow, strict=True)]
                    if len(prow) == len(nrow) and prow
                    else [None]
                )
                ok = [p for p in parts if p is not None]
                views.append(memoryview(b"".join(ok)) if len(ok) == len(parts) else None)
            native = self._native(config)
            return self._write_resolved(store, ks, views, native, upsert=False, zero_copy=False)

        return self._run_list(len(ks), op)

    # ------------------------------------------------------------------ get

    def get(self, key: str) -> bytes:
        """The value of `key`; b"" when it is missing or anything fails (Mooncake's answer)."""
        k = _check_key(key)
        store = self._store
        if store is None or not k:
            return b""
        try:
            return self._read(store, k, bytes)
        except Exception as exc:
            _code(exc)
            return b""

    def _read(self, store: Store, key: str, wrap: Callable[[Any], T]) -> T:
        """The value of `key` wrapped by `wrap` (bytes or BufferHandle), copied once out of
        the staging buffer when it is free and large enough, else out of a fresh read."""
        staging = self._staging
        # Never wait for the staging buffer: a thread that finds it busy reads the plain way,
        # so concurrent gets are not serialised.
        if staging is not None and self._staging_lock.acquire(blocking=False):
            try:
                n = store.get_into(key, staging)
                return wrap(staging.data[:n])
            except InvalidParams:
                pass  # larger than the staging buffer: read it into memory of its own
            finally:
                self._staging_lock.release()
        return wrap(store.get(key))

    def get_batch(self, keys: list[str]) -> list[bytes]:
        """The values, b"" for each missing key; [b""] when the whole batch fails."""
        ks = _check_keys(keys)
        store = self._store
        if store is None or not ks:
            return [b""]
        try:
            values = self._batch_values(store, ks)
        except Exception as exc:
            _code(exc)
            return [b""]
        return [b"" if v is None else bytes(v) for v in values]

    @staticmethod
    def _batch_values(store: Store, keys: list[str]) -> list[bytearray | None]:
        valid = [i for i, k in enumerate(keys) if k]
        got = store.batch_get([keys[i] for i in valid]) if valid else []
        out: list[bytearray | None] = [None] * len(keys)
        for i, v in zip(valid, got, strict=True):
            out[i] = v
        return out

    def get_buffer(self, key: str) -> BufferHandle | None:
        """The value as a BufferHandle (ptr(), size(), buffer protocol); None on a miss."""
        k = _check_key(key)
        store = self._store
        if store is None or not k:
            return None
        try:
            return self._read(store, k, BufferHandle)
        except Exception as exc:
            _code(exc)
            return None

    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        ks = _check_keys(keys)
        store = self._store
        if store is None:
            return [None] * len(ks)
        try:
            values = self._batch_values(store, ks)
        except Exception as exc:
            _code(exc)
            return [None] * len(ks)
        return [None if v is None else BufferHandle(v) for v in values]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Read `key` into `size` registered bytes at `buffer_ptr`; bytes read or a code
        (-600 when the buffer is too small or not registered)."""
        k, ptr, n = _check_key(key), _ptr(buffer_ptr), _ptr(size)

        def op(store: Store) -> int:
            mv = self._pointers.resolve(ptr, n)
            if not k:
                return NOT_FOUND
            return store.get_into(k, mv)

        return self._run(op)

    def batch_get_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        """get_into per key: bytes read or a code per key (-600 for all on a length mismatch)."""
        ks = _check_keys(keys)
        ptrs, ns = [_ptr(p) for p in buffer_ptrs], [_ptr(s) for s in sizes]

        def op(store: Store) -> list[int]:
            if not len(ks) == len(ptrs) == len(ns):
                return [INVALID] * len(ks)
            out = [INVALID] * len(ks)
            views = [self._pointers.find(p, n) for p, n in zip(ptrs, ns, strict=True)]
            for i, k in enumerate(ks):
                if views[i] is not None and not k:
                    out[i] = NOT_FOUND
            good = [(i, v) for i, v in enumerate(views) if v is not None and ks[i]]
            if good:
                got = store.batch_get_into([ks[i] for i, _ in good], [v for _, v in good])
                for (i, _), n in zip(good, got, strict=True):
                    out[i] = int(n)
            return out

        return self._run_list(len(ks), op)

    def batch_get_into_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Scatter each value over its registered buffers, in order; bytes read per key."""
        ks = _check_keys(keys)
        ptrs = [[_ptr(p) for p in row] for row in all_buffer_ptrs]
        ns = [[_ptr(s) for s in row] for row in all_sizes]

        def op(store: Store) -> list[int]:
            if not len(ks) == len(ptrs) == len(ns):
                return [INVALID] * len(ks)
            out = [INVALID] * len(ks)
            targets: dict[int, list[memoryview]] = {}
            for i, (prow, nrow) in enumerate(zip(ptrs, ns, strict=True)):
                parts = [self._pointers.find(p, n) for p, n in zip(prow, nrow, strict=False)]
                if len(prow) == len(nrow) and prow and all(p is not None for p in parts):
                    targets[i] = [p for p in parts if p is not None]
            order = list(targets)
            values = self._batch_values(store, [ks[i] for i in order])
            for i, value in zip(order, values, strict=True):
                if value is None:
                    out[i] = NOT_FOUND
                    continue
                if len(value) > sum(p.nbytes for p in targets[i]):
                    continue  # INVALID: the buffers are too small
                at = 0
                for part in targets[i]:
                    chunk = value[at : at + part.nbytes]
                    part[: len(chunk)] = chunk
                    at += len(chunk)
                out[i] = len(value)
            return out

        return self._run_list(len(ks), op)

    def get_into_ranges(
        self,
        buffer_ptrs: list[int],
        all_keys: list[list[str]],
        all_dst_offsets: list[list[list[int]]],
        all_src_offsets: list[list[list[int]]],
        all_sizes: list[list[list[int]]],
    ) -> list[list[list[int]]]:
        """Byte ranges of objects into registered buffers, buffer by buffer: for buffer `b`,
        key `k` of `all_keys[b]` and its fragment `i`, copy `all_sizes[b][k][i]` bytes from
        offset `all_src_offsets[b][k][i]` of the object to `buffer_ptrs[b] +
        all_dst_offsets[b][k][i]`. Answers the bytes copied (or a code) per fragment, shaped
        like `all_sizes`; mismatched lengths answer -600 at the level where they occur (the
        shapes the wheel answers). Each object is read once, whole, then copied from."""
        n = len(buffer_ptrs)
        starts = [_ptr(p) for p in buffer_ptrs]
        store = self._store
        if store is None:
            return [[[UNAVAILABLE]] for _ in range(n)]
        if not n == len(all_keys) == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes):
            return [[[INVALID]] for _ in range(n)]
        rows = list(zip(all_keys, all_dst_offsets, all_src_offsets, all_sizes, strict=True))
        shaped = [len(k) == len(d) == len(s) == len(z) for k, d, s, z in rows]
        wanted = sorted(
            {_check_key(k) for ok, row in zip(shaped, rows, strict=True) if ok for k in row[0]}
        )
        try:
            values = dict(zip(wanted, self._batch_values(store, wanted), strict=True))
        except Exception as exc:
            return [[[_code(exc)]] for _ in range(n)]
        out: list[list[list[int]]] = []
        for start, ok, (keys, dsts, srcs, sizes) in zip(starts, shaped, rows, strict=True):
            if not ok:
                out.append([[INVALID] for _ in keys])
                continue
            row: list[list[int]] = []
            for key, dst, src, size in zip(keys, dsts, srcs, sizes, strict=True):
                if not len(dst) == len(src) == len(size):
                    row.append([INVALID])
                    continue
                value = values.get(key)
                frags: list[int] = []
                for d, s_off, z in zip(dst, src, size, strict=True):
                    frags.append(self._copy_range(value, start + _ptr(d), _ptr(s_off), _ptr(z)))
                row.append(frags)
            out.append(row)
        return out

    def _copy_range(self, value: bytearray | None, dst: int, src: int, size: int) -> int:
        if value is None:
            return NOT_FOUND
        if size == 0:
            return 0
        if src < 0 or size < 0 or src + size > len(value):
            return INVALID
        view = self._pointers.find(dst, size)
        if view is None:
            return INVALID
        view[:] = value[src : src + size]
        return size

    # ------------------------------------------------------------------ queries

    def is_exist(self, key: str) -> int:
        """1 if `key` exists, 0 if not, or a code (grants a read lease, as Mooncake)."""
        k = _check_key(key)
        return self._run(lambda store: int(store.exists(k)) if k else 0)

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        ks = _check_keys(keys)

        def op(store: Store) -> list[int]:
            valid = [i for i, k in enumerate(ks) if k]
            got = store.batch_exists([ks[i] for i in valid]) if valid else []
            out = [0] * len(ks)
            for i, e in zip(valid, got, strict=True):
                out[i] = int(e)
            return out

        return self._run_list(len(ks), op)

    def get_size(self, key: str) -> int:
        """The value's size in bytes, or a code (-704 when missing)."""
        k = _check_key(key)
        return self._run(lambda store: store.get_size(k) if k else NOT_FOUND)

    # ------------------------------------------------------------------ remove

    def remove(self, key: str, force: bool = False) -> int:
        """0, -704 when missing, -706 while a reader's lease lasts (unless `force`)."""
        k = _check_key(key)

        def op(store: Store) -> int:
            if not k:
                return NOT_FOUND
            store.remove(k, bool(force))
            return OK

        return self._run(op)

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        ks = _check_keys(keys)

        def op(store: Store) -> list[int]:
            valid = [i for i, k in enumerate(ks) if k]
            got = store.batch_remove([ks[i] for i in valid], bool(force)) if valid else []
            out = [NOT_FOUND] * len(ks)
            for i, c in zip(valid, got, strict=True):
                out[i] = int(c)
            return out

        return self._run_list(len(ks), op)

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Remove the keys the pattern is found in; the count removed (leased keys are skipped
        unless `force`), or -600 for a bad pattern."""
        if not isinstance(regex_pattern, str):
            raise TypeError("regex_pattern: expected str")
        return self._run(lambda store: store.remove_by_regex(regex_pattern, bool(force)))

    def remove_all(self, force: bool = False) -> int:
        """Remove every object of this tenant (leased ones only with `force`); the count."""
        return self._run(lambda store: store.remove_all(bool(force)))

    # ------------------------------------------------------------------ replicas and tasks

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """The replicas of `key` ([] when missing, still being written, or on any failure);
        grants a read lease, as a get does."""
        k = _check_key(key)
        store = self._store
        if store is None or not k:
            return []
        try:
            return [_replica_descriptor(d) for d in store.get_replica_desc(k)]
        except Exception as exc:
            _code(exc)
            return []

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDescriptor]]:
        """get_replica_desc of every key, in one round trip: key → its replicas."""
        ks = _check_keys(keys)
        store = self._store
        out: dict[str, list[ReplicaDescriptor]] = {k: [] for k in ks}
        valid = [k for k in dict.fromkeys(ks) if k]
        if store is None or not valid:
            return out
        try:
            got = store.batch_get_replica_desc(valid)
        except Exception as exc:
            _code(exc)
            return out
        for k, descs in got.items():
            out[k] = [_replica_descriptor(d) for d in descs]
        return out

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        """Copy `key` to one new replica on each target segment (store hostnames, as
        `get_hostname()` and `Descriptor.transport_endpoint` name them): `(task id, 0)`, or
        `((0, 0), code)`. The copy runs in the store that owns the source replica."""
        k, names = _check_key(key), _check_names(targets, "targets")

        def op(store: Store) -> tuple[tuple[int, int], int]:
            segments = _segment_names(names)
            if not k or not segments:
                return NO_ID, INVALID
            return uuid_pair(store.create_copy_task(k, segments)), OK

        return self._run_task(op)

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        """Move `key`'s replica on segment `source` to segment `target`: `(task id, 0)`, or
        `((0, 0), code)`."""
        k = _check_key(key)
        src, dst = _check_names([source, target], "source and target")

        def op(store: Store) -> tuple[tuple[int, int], int]:
            s, t = _segment_names([src])[:1], _segment_names([dst])[:1]
            if not k or not s or not t or s == t:
                return NO_ID, INVALID
            return uuid_pair(store.create_move_task(k, s[0], t[0])), OK

        return self._run_task(op)

    def _run_task(
        self, op: Callable[[Store], tuple[tuple[int, int], int]]
    ) -> tuple[tuple[int, int], int]:
        store = self._store
        if store is None:
            return NO_ID, UNAVAILABLE
        try:
            return op(store)
        except Exception as exc:
            return NO_ID, _task_code(exc)

    def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]:
        """A task's state: `(QueryTaskResponse, 0)`, or `(None, code)` (-1400 for a task the
        master does not know). `task_id` is the `(high, low)` pair create_*_task answered."""
        hex_id = uuid_hex(task_id)
        store = self._store
        if store is None:
            return None, UNAVAILABLE
        try:
            info = store.query_task(hex_id)
        except Exception as exc:
            return None, _code(exc)
        # The master's times are on its own clock; Mooncake answers epoch milliseconds, so
        # they are placed on this host's wall clock by the task's age.
        created_ms = int(time.time() * 1000 - info.age_s * 1000)
        updated_ms = created_ms + int((info.updated_s - info.created_s) * 1000)
        return (
            QueryTaskResponse(
                id=uuid_pair(info.task_id),
                type=TaskType.REPLICA_MOVE
                if info.task_type.name == "MOVE"
                else TaskType.REPLICA_COPY,
                status=TaskStatus[info.status.name],
                created_at_ms_epoch=created_ms,
                last_updated_at_ms_epoch=updated_ms,
                assigned_client=uuid_pair(info.executor),
                message=info.message,
            ),
            OK,
        )

    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        """Drop the replicas of this store's own objects among `keys` whose lease has expired
        (all of them, or only those on `segment_name`); the keys cleared ([] on failure)."""
        ks = _check_keys(keys)
        if not isinstance(segment_name, str):
            raise TypeError("segment_name: expected str")
        store = self._store
        valid = [k for k in dict.fromkeys(ks) if k]
        if store is None or not valid:
            return []
        segments = _segment_names([segment_name]) if segment_name else [""]
        cleared: dict[str, None] = {}
        try:
            for segment in segments:
                cleared.update(dict.fromkeys(store.batch_replica_clear(valid, segment)))
        except Exception as exc:
            _code(exc)
        return list(cleared)

    # ------------------------------------------------------------------ sessions

    def batch_put_session_start(
        self, keys: list[str], sizes: list[int], config: ReplicateConfig | None = None
    ) -> list[int]:
        """Start assembling one object of `sizes[i]` bytes per key (sessions.py): 0, -705 when
        the key exists or has a session, -600 for an empty key or a size of 0."""
        ks, ns = _check_keys(keys), [_ptr(n) for n in sizes]

        def op(store: Store) -> list[int]:
            if len(ks) != len(ns):
                return [INVALID] * len(ks)
            native = self._native(config)
            out = [INVALID if not k or n <= 0 else OK for k, n in zip(ks, ns, strict=True)]
            ask = [k for i, k in enumerate(ks) if out[i] == OK and not self._sessions.has_put(k)]
            exists = dict(zip(ask, store.batch_exists(ask), strict=True)) if ask else {}
            for i, (k, n) in enumerate(zip(ks, ns, strict=True)):
                if out[i] != OK:
                    continue
                if exists.get(k, True) or not self._sessions.open_put(k, n, native):
                    out[i] = int(EXISTS)
            return out

        return self._run_list(len(ks), op)

    def batch_put_from_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_dst_offsets: list[list[int]],
    ) -> list[int]:
        """Within put sessions: copy `all_sizes[i][j]` registered bytes at
        `all_buffer_ptrs[i][j]` to offset `all_dst_offsets[i][j]` of key i's object; bytes
        written per key, -600 without a session, past the object's size, or for memory that
        is not registered."""
        ks = _check_keys(keys)
        rows = self._range_rows(len(ks), all_buffer_ptrs, all_sizes, all_dst_offsets)

        def op(store: Store) -> list[int]:
            out = [INVALID] * len(ks)
            for i, k in enumerate(ks):
                session = self._sessions.put_session(k)
                ranges = rows[i]
                if session is None or ranges is None:
                    continue
                if not ranges:
                    out[i] = NO_RANGES  # the wheel's answer to a key given no ranges
                    continue
                got = copy_from_ranges(session.data, ranges)
                out[i] = got if got >= 0 else INVALID
            return out

        return self._run_list(len(ks), op)

    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        """Put each session's object into the pool, readable from now on: 0 per key, -600 for
        a key without a put session (the code of the put when it fails)."""
        ks = _check_keys(keys)

        def op(store: Store) -> list[int]:
            out = [INVALID] * len(ks)
            for i, k in enumerate(ks):
                session = self._sessions.close_put(k)
                if session is None:
                    continue
                try:
                    out[i] = OK if store.put(k, session.data, session.config) else int(EXISTS)
                except KVPoolError as exc:
                    out[i] = int(exc.code)
            return out

        return self._run_list(len(ks), op)

    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        """Drop put sessions unwritten: 0 per key, -600 for a key without one."""
        ks = _check_keys(keys)
        return self._run_list(
            len(ks),
            lambda store: [INVALID if self._sessions.close_put(k) is None else OK for k in ks],
        )

    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        """Look each object up once for the ranged gets that follow: 0, -704 when missing."""
        ks = _check_keys(keys)

        def op(store: Store) -> list[int]:
            values = self._batch_values(store, ks)
            out: list[int] = []
            for k, value in zip(ks, values, strict=True):
                if value is None:
                    # An object of this store's own put session exists, but is not complete.
                    out.append(NOT_READY if self._sessions.has_put(k) else NOT_FOUND)
                else:
                    self._sessions.open_get(k, value)
                    out.append(OK)
            return out

        return self._run_list(len(ks), op)

    def batch_get_into_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_src_offsets: list[list[int]],
    ) -> list[int]:
        """Within get sessions: copy `all_sizes[i][j]` bytes from offset
        `all_src_offsets[i][j]` of key i's object to the registered memory at
        `all_buffer_ptrs[i][j]`; bytes read per key, -600 without a session, past the
        object's end, or for memory that is not registered."""
        ks = _check_keys(keys)
        rows = self._range_rows(len(ks), all_buffer_ptrs, all_sizes, all_src_offsets)

        def op(store: Store) -> list[int]:
            out = [INVALID] * len(ks)
            for i, k in enumerate(ks):
                value = self._sessions.get_session(k)
                ranges = rows[i]
                if value is not None and ranges is not None:
                    got = copy_into_ranges(value, ranges)
                    out[i] = got if got >= 0 else INVALID
            return out

        return self._run_list(len(ks), op)

    def batch_get_session_end(self, keys: list[str]) -> int:
        """End get sessions (keys without one are ignored); 0."""
        ks = _check_keys(keys)
        if self._store is None:
            return UNAVAILABLE
        for k in ks:
            self._sessions.close_get(k)
        return OK

    def _range_rows(
        self,
        n: int,
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_offsets: list[list[int]],
    ) -> list[list[tuple[memoryview, int]] | None]:
        """Per key, its (registered view, object offset) ranges; None for a key whose lists
        do not line up or name memory outside every registration (never dereferenced).
        Ranges of 0 bytes are dropped: they copy nothing (0 in the wheel too)."""
        ptrs = [[_ptr(p) for p in row] for row in all_buffer_ptrs]
        sizes = [[_ptr(z) for z in row] for row in all_sizes]
        offsets = [[_ptr(o) for o in row] for row in all_offsets]
        if not n == len(ptrs) == len(sizes) == len(offsets):
            return [None] * n
        rows: list[list[tuple[memoryview, int]] | None] = []
        for prow, zrow, orow in zip(ptrs, sizes, offsets, strict=True):
            if not len(prow) == len(zrow) == len(orow):
                rows.append(None)
                continue
            row = [(p, z, o) for p, z, o in zip(prow, zrow, orow, strict=True) if z != 0]
            views = [self._pointers.find(p, z) for p, z, _ in row]
            if any(v is None for v in views):
                rows.append(None)
                continue
            rows.append([(v, o) for v, (_, _, o) in zip(views, row, strict=True) if v is not None])
        return rows

    # ------------------------------------------------------------------ tensors

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Store a torch tensor in Mooncake's tensor format (needs torch)."""
        return self._put_tensor(_check_key(key), tensor, None, upsert=False)

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self._put_tensor(_check_key(key), tensor, None, upsert=True)

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        """put_tensor with a ReplicateConfig."""
        return self._put_tensor(_check_key(key), tensor, config, upsert=False)

    def upsert_pub_tensor(
        self, key: str, tensor: Any, config: ReplicateConfig | None = None
    ) -> int:
        return self._put_tensor(_check_key(key), tensor, config, upsert=True)

    def _put_tensor(
        self, key: str, tensor: Any, config: ReplicateConfig | None, *, upsert: bool
    ) -> int:
        try:
            header, data = tensor_format.tensor_to_parts(tensor)
        except (ImportError, TypeError, ValueError) as exc:
            log.error("put_tensor %r: %s", key, exc)
            return INVALID
        return self._put(key, _join_parts((header, data)), config, upsert=upsert)

    def batch_pub_tensor(
        self, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]:
        """pub_tensor per key; one code per key."""
        ks = _check_keys(keys)
        if len(ks) != len(tensors_list):
            return [INVALID] * len(ks)
        return [self.pub_tensor(k, t, config) for k, t in zip(ks, tensors_list, strict=True)]

    def batch_upsert_pub_tensor(
        self, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]:
        ks = _check_keys(keys)
        if len(ks) != len(tensors_list):
            return [INVALID] * len(ks)
        return [self.upsert_pub_tensor(k, t, config) for k, t in zip(ks, tensors_list, strict=True)]

    def batch_put_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        ks = _check_keys(keys)
        if len(ks) != len(tensors_list):
            return [INVALID] * len(ks)
        return [self.put_tensor(k, t) for k, t in zip(ks, tensors_list, strict=True)]

    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        ks = _check_keys(keys)
        if len(ks) != len(tensors_list):
            return [INVALID] * len(ks)
        return [self.upsert_tensor(k, t) for k, t in zip(ks, tensors_list, strict=True)]

    def get_tensor(self, key: str) -> Any:
        """The tensor stored under `key` (sharing the bytes read), or None."""
        k = _check_key(key)
        store = self._store
        if store is None or not k:
            return None
        try:
            return tensor_format.bytes_to_tensor(store.get(k))
        except ImportError as exc:
            log.error("get_tensor needs torch: %s", exc)
            return None
        except Exception as exc:
            _code(exc)
            return None

    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        return [self.get_tensor(k) for k in _check_keys(keys)]

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Store registered bytes laid out as [TensorMetadata][data]; -600 when the header is
        not one Mooncake accepts. Needs no torch."""
        return self._tensor_from(_check_key(key), _ptr(buffer_ptr), _ptr(size), upsert=False)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._tensor_from(_check_key(key), _ptr(buffer_ptr), _ptr(size), upsert=True)

    def _tensor_from(self, key: str, ptr: int, size: int, *, upsert: bool) -> int:
        def op(store: Store) -> int:
            mv = self._pointers.resolve(ptr, size)
            if tensor_format.parse_header(mv) is None:
                raise InvalidParams(f"{key!r}: not a valid Mooncake tensor object")
            if upsert:
                store.upsert(key, mv)
            else:
                store.put_from(key, mv)
            return OK

        return self._run(op)

    def batch_put_tensor_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        return self._batch_tensor_from(keys, buffer_ptrs, sizes, upsert=False)

    def batch_upsert_tensor_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        return self._batch_tensor_from(keys, buffer_ptrs, sizes, upsert=True)

    def _batch_tensor_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], *, upsert: bool
    ) -> list[int]:
        ks = _check_keys(keys)
        ptrs, ns = [_ptr(p) for p in buffer_ptrs], [_ptr(s) for s in sizes]

        def op(store: Store) -> list[int]:
            if not len(ks) == len(ptrs) == len(ns):
                return [INVALID] * len(ks)
            views = [self._pointers.find(p, n) for p, n in zip(ptrs, ns, strict=True)]
            # As the wheel: one unreadable object fails the whole batch, before any write.
            if any(v is None or tensor_format.parse_header(v) is None for v in views):
                return [INVALID] * len(ks)
            return self._write_resolved(store, ks, views, None, upsert=upsert)

        return self._run_list(len(ks), op)

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Read a tensor object into registered memory; the tensor viewing it, or None."""
        ptr, n = _ptr(buffer_ptr), _ptr(size)
        got = self.get_into(key, ptr, n)
        if got < 0:
            return None
        try:
            return tensor_format.bytes_to_tensor(self._pointers.resolve(ptr, got))
        except Exception as exc:
            log.error("get_tensor_into %r: %s", key, exc)
            return None

    def batch_get_tensor_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[Any]:
        ks = _check_keys(keys)
        if not len(ks) == len(buffer_ptrs) == len(sizes):
            return [None] * len(ks)
        return [
            self.get_tensor_into(k, p, n) for k, p, n in zip(ks, buffer_ptrs, sizes, strict=True)
        ]


def _check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected str, got {type(value).__name__}")
    return value


def _unsigned(value: object, what: str) -> int:
    """An int >= 0 (TypeError otherwise, as pybind11 answers for its unsigned arguments)."""
    n = _ptr(value)
    if n < 0:
        raise TypeError(f"{what}: expected an int >= 0, got {n}")
    return n


def _check_names(names: object, what: str) -> list[str]:
    """Segment names: a list of str (TypeError otherwise, as pybind11)."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"{what}: expected a list of str, got {type(names).__name__}")
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"{what}: expected str")
    return [n for n in names if n]


_BAD_SEGMENT: Final = (int(ErrorCode.SEGMENT_NOT_FOUND), int(ErrorCode.REPLICA_NOT_FOUND))


def _task_code(exc: BaseException) -> int:
    """Mooncake's code for a refused task: a segment that does not exist, or a move source
    that holds no replica of the key, is a bad argument there (-600, checked on the wheel)."""
    code = _code(exc)
    return INVALID if code in _BAD_SEGMENT else code


def _replica_descriptor(desc: ReplicaDesc) -> ReplicaDescriptor:
    status = ReplicaStatus(int(desc.status))
    if desc.kind == ReplicaKind.MEMORY:
        where = Descriptor(desc.size, desc.offset, _mooncake_segment(desc.segment))
        return ReplicaDescriptor(status, MemoryDescriptor(where))
    disk = DiskDescriptor(desc.segment, desc.size)
    return ReplicaDescriptor(status, None, disk, desc.kind == ReplicaKind.LOCAL_DISK)


def _select_groups(native: Any, indices: list[int], n_keys: int) -> Any:
    """`native` for the keys at `indices` of a batch of `n_keys`: group ids are one per key
    (SGLang passes them so), so a batch written in part needs the matching part of them."""
    groups = None if native is None else native.group_ids
    if groups is None or len(indices) == n_keys or len(groups) != n_keys:
        return native  # nothing to select (or a mismatch the native config reports itself)
    return dataclasses.replace(native, group_ids=tuple(groups[i] for i in indices))


def _join_parts(parts: Sequence[Any]) -> memoryview:
    views = []
    for p in parts:
        mv = memoryview(p)
        if mv.ndim != 1:
            # Mooncake's one raising path: "parts must be 1-D bytes-like".
            raise RuntimeError("parts must be 1-D bytes-like")
        views.append(mv.cast("B") if mv.format != "B" else mv)
    if len(views) == 1:
        return views[0]
    return memoryview(b"".join(views))


def _endpoint_port(segments: list[str]) -> int | None:
    """The port of this store's transfer server, from its segment name "host:port/n"."""
    for name in segments:
        endpoint = name.rsplit("/", 1)[0]
        _, _, port = endpoint.rpartition(":")
        if port.isdigit():
            return int(port)
    return None


def _any_free_port() -> int:
    """A port number for a pure client's name (Mooncake binds one; kvpool serves nothing)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
