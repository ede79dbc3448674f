"""`Store`: the synchronous, thread-safe client of a kvpool pool (`kvpool.Store`).

A Store owns two things: a `NodeRuntime` (its client id, the control-plane connection to the
master, its heartbeat and, with `segment_size > 0`, a segment of this process's memory mounted
into the pool) and a `DataPath` (the `TransferEngine` — memcpy for its own segment, a mapping of
the owner's shared memory on this host, TCP to other hosts — plus a cache of segment locations
and the same-host fast paths). This module is the API and the put/get lifecycles; `datapath`
is how the bytes move.

Put (`put`, `upsert`, `put_from` and the batch forms)
    PutStart (or UpsertStart) at the master allocates the replicas → the value is written into
    every replica, all in one engine batch (in parallel) → PutEnd with the value's xxh3_64
    makes it readable. If any replica's write fails the Store sends PutRevoke, which frees the
    space: a failed put leaves no trace. A put whose key exists answers False (insert-if-absent,
    as Mooncake); `upsert` overwrites. Batches use one BatchPutStart and one BatchPutEnd (plus
    one BatchPutRevoke for the keys whose writes failed) for the whole batch and report each
    key's outcome as an `ErrorCode`.

    One round trip instead of two (`kvpool.client.arena`): a put or batch_put of values up to
    a quarter of `arena_size` with one replica and nothing preferred cuts its ranges from an
    arena the master lent this Store, writes the values there, and sends one PutCommit (one
    BatchPutCommit for a batch) that makes them readable. An existing key answers False /
    OBJECT_ALREADY_EXISTS as before (its bytes were written for nothing). When the master has
    no arena to give (a full pool) or forgot the arena, the put takes PutStart/PutEnd.

Get (`get`, `get_into`, the batch forms)
    GetReplicaList grants a read lease and names the replicas → the first COMPLETE memory
    replica on this host is read, else the first complete one; a replica whose read fails (or
    whose bytes fail the checksum) is skipped for the next → the xxh3_64 recorded at PutEnd is
    verified (CHECKSUM_MISMATCH; `verify_checksum=False` turns it off) → a read that finished
    after its lease expired is refused (LEASE_EXPIRED). Batches use one BatchGetLocations (the
    compact form of BatchGetReplicaList) and one copy loop for all first choices; a batch whose
    keys all sit on one segment mapped here is read in one loop under one hold.

Values are copied once, straight between the caller's memory and segment memory: `put` writes
from the value's own buffer, `get` allocates its result once and reads into it, `put_from` and
`get_into` use memory registered with `register_buffer` (the zero-copy API, as Mooncake's).

Errors: bad input raises `InvalidParams` before anything is sent; master outcomes become the
exception of their code (`ObjectNotFound`, `NoSpace`, `ObjectHasLease`, ...); a call after
`close()` raises `StoreClosed` (the real Mooncake segfaults there).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Final, Literal, TypeVar

import xxhash

from kvpool.client.arena import Arena, Arenas
from kvpool.client.datapath import CHUNKED_MIN, DataPath
from kvpool.client.node import DEFAULT_RPC_TIMEOUT_S, NodeRuntime
from kvpool.client.replica import (
    checksum,
    lease_deadline,
    order_replicas,
    verify_checksum,
    verify_lease,
)
from kvpool.client.replicate import DEFAULT_CONFIG, ReplicateConfig
from kvpool.client.tasks import DEFAULT_POLL_INTERVAL_S, TaskAPI, TaskExecutor
from kvpool.config import parse_size
from kvpool.errors import (
    ChecksumMismatch,
    ErrorCode,
    InvalidParams,
    KVPoolError,
    StoreClosed,
    TransferError,
    error_for_code,
    raise_for_code,
)
from kvpool.protocol.messages import (
    BatchExistKey,
    BatchExistReply,
    BatchGetLocations,
    BatchPutCommit,
    BatchPutEnd,
    BatchPutRevoke,
    BatchPutStart,
    BatchPutStartReply,
    BatchRemove,
    BatchReply,
    BatchUpsertStart,
    CountReply,
    ExistKey,
    ExistReply,
    GetReplicaList,
    GetSize,
    LocationsReply,
    PutCommit,
    PutEnd,
    PutRevoke,
    PutStart,
    PutStartReply,
    Remove,
    RemoveAll,
    RemoveByRegex,
    ReplicaDesc,
    ReplicaKind,
    ReplicaListReply,
    ReplicaStatus,
    ReplicateConfigMsg,
    Reply,
    SegmentName,
    SizeReply,
    Stats,
    StatsReply,
    TenantId,
    UpsertStart,
)
from kvpool.transfer.registration import buffer_address, byte_view
from kvpool.transfer.request import TransferOp, TransferRequest

__all__ = ["HealthStatus", "Store"]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_KEY_BYTES: Final = 4096
"""Longer keys are refused (INVALID_PARAMS): keys are names, not payloads."""
DEFAULT_TRANSFER_TIMEOUT_S: Final = 60.0
_PROTOCOLS: Final = ("auto", "shm", "tcp")


class HealthStatus(IntEnum):
    """`Store.health_check()` (Mooncake's numbers: 0 healthy, 1 closed, 2 master unreachable)."""

    HEALTHY = 0
    CLOSED = 1
    MASTER_UNREACHABLE = 2


Buffer = object
"""Anything with the buffer protocol (bytes, bytearray, memoryview, numpy array, mmap, ...)."""


_DEFAULT_MSG: Final = DEFAULT_CONFIG.to_msg()
"""The wire form of the default config (frozen), made once rather than on every put."""
_OK: Final = int(ErrorCode.OK)
_NOT_FOUND: Final = int(ErrorCode.OBJECT_NOT_FOUND)
_EXISTS: Final = int(ErrorCode.OBJECT_ALREADY_EXISTS)
_INVALID_WRITE: Final = int(ErrorCode.INVALID_WRITE)
_MEMORY: Final = ReplicaKind.MEMORY
_PROCESSING: Final = ReplicaStatus.PROCESSING


def _or_hash(digest: int | None, view: memoryview) -> int:
    """`digest` when the copy took it, else the value's checksum now."""
    return checksum(view) if digest is None else digest


def _arena_config(cfg: ReplicateConfigMsg) -> bool:
    """Whether a put with `cfg` may take an arena: one replica, placed by the master."""
    return cfg.replica_num == 1 and not cfg.preferred_segments and not cfg.prefer_alloc_in_same_node


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidParams(f"key: expected a str, got {type(key).__name__}")
    if not key:
        raise InvalidParams("key: the empty string is not a key")
    if len(key) > MAX_KEY_BYTES // 4 and len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidParams(f"key: {len(key.encode())} bytes, over the {MAX_KEY_BYTES}-byte limit")
    return key


def _check_keys(keys: object, *, unique: bool) -> list[str]:
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise InvalidParams(f"keys: expected a list of str, got {type(keys).__name__}")
    out = list(keys)
    # One comprehension for the whole batch; only suspicious keys take the full check.
    limit = MAX_KEY_BYTES // 4
    for k in [k for k in out if type(k) is not str or not k or len(k) > limit]:
        _check_key(k)
    if unique and len(set(out)) != len(out):
        raise InvalidParams("keys: a write batch names the same key twice")
    return out


def _value_view(value: object, what: str = "value") -> memoryview:
    if type(value) is bytes and value:  # flat bytes already: skip byte_view's checks
        return memoryview(value)
    mv = byte_view(value, what=what)
    if mv.nbytes == 0:
        raise InvalidParams(f"{what}: zero-length values are not stored")
    return mv


def _code(value: int) -> ErrorCode:
    """`ErrorCode.of`, without the enum lookup for the common OK (batches call it per key)."""
    return ErrorCode.OK if value == 0 else ErrorCode.of(value)


def _reply(reply: object, kind: type[T]) -> T:
    if not isinstance(reply, kind):
        raise KVPoolError(
            f"expected {kind.__name__}, got {type(reply).__name__}", ErrorCode.DESERIALIZE_FAIL
        )
    return reply


class Store(TaskAPI):
    """A client of the pool at `master` (see the module docstring); use as a context manager.

    Arguments (Mooncake's `setup`, in Python form):
        master: "host:port" of the master.
        segment_size: bytes ("4GiB" or an int) of this process's memory to contribute to the
            pool; 0 for a pure client.
        local_buffer_size: accepted for Mooncake compatibility. kvpool needs no staging
            buffer (values move straight between your memory and the segment), so it only
            has to be a valid size.
        host: the address this process's transfer server binds (only with a segment).
        tenant: the namespace of every key of this Store.
        protocol: "auto" (memcpy / shared memory on this host, TCP otherwise), "shm" or "tcp"
            (force TCP, for benchmarks and tests).
        verify_checksum: check every read against the checksum recorded at PutEnd.
        rpc_timeout, transfer_timeout: seconds before a control call / a transfer gives up.
        heartbeat_interval: seconds between Pings (1 s; tests shorten it).
        cluster_id: must match the master's.
        task_poll_interval: with a segment, seconds between polls for replica copy/move tasks
            the master assigns to this process (`kvpool.client.tasks`).
        arena_size: bytes of each arena the master lends this Store for puts in one round
            trip (values up to a quarter of it take that path); 0 turns arenas off.
    """

    def __init__(
        self,
        master: str = "127.0.0.1:50051",
        *,
        segment_size: int | str = 0,
        local_buffer_size: int | str = 0,
        host: str = "127.0.0.1",
        tenant: str = "default",
        protocol: str = "auto",
        verify_checksum: bool = True,
        rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S,
        transfer_timeout: float = DEFAULT_TRANSFER_TIMEOUT_S,
        heartbeat_interval: float = 1.0,
        cluster_id: str = "kvpool",
        task_poll_interval: float = DEFAULT_POLL_INTERVAL_S,
        arena_size: int | str = "64MiB",
    ) -> None:
        self._closed = True  # until fully set up, so close() from a failed __init__ is safe
        self._arenas: Arenas | None = None
        seg_bytes = parse_size(segment_size, name="segment_size")
        arena_bytes = parse_size(arena_size, name="arena_size")
        parse_size(local_buffer_size, name="local_buffer_size")
        if protocol not in _PROTOCOLS:
            raise InvalidParams(f"protocol: {protocol!r} is not one of {', '.join(_PROTOCOLS)}")
        if not isinstance(tenant, str) or not tenant:
            raise InvalidParams(f"tenant: expected a non-empty str, got {tenant!r}")
        if transfer_timeout <= 0:
            raise InvalidParams(f"transfer_timeout: {transfer_timeout!r} must be > 0 s")
        self.master = master
        self.tenant = TenantId(tenant)
        self.protocol: Literal["auto", "shm", "tcp"] = protocol  # type: ignore[assignment]
        self.verify_checksum = verify_checksum
        self.transfer_timeout = float(transfer_timeout)
        self._node = NodeRuntime(
            master,
            host=host,
            rpc_timeout=rpc_timeout,
            heartbeat_interval=heartbeat_interval,
            cluster_id=cluster_id,
            name="kvpool-store",
        )
        self._data: DataPath | None = None
        self._tasks: TaskExecutor | None = None
        self._task_poll_interval = task_poll_interval
        self._mount_lock = threading.Lock()
        try:
            self._data = DataPath(self._node, self.protocol, self.transfer_timeout)
            self._node.start()
            node = self._node
            self._arenas = Arenas(lambda: node.rpc, node.client_id, arena_bytes)
            node.on_heartbeat = self._arenas.on_heartbeat
            if seg_bytes > 0:
                self._mount(self._data, seg_bytes)
        except BaseException:
            self._teardown()
            raise
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def client_id(self) -> str:
        return self._node.client_id

    @property
    def segments(self) -> list[str]:
        """Names of the segments this Store has mounted now, oldest first (a copy)."""
        return list(self._node.segments)

    def close(self) -> None:
        """Unmount this process's segments, stop the heartbeat and every thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._teardown()

    def _teardown(self) -> None:
        # Tasks stop first (one being copied is finished and reported), then the node
        # unmounts (the master stops handing out our segments), then the engine lets go of
        # peer mappings and sockets. Under the mount lock: a mount_segment racing with close
        # either finishes first (and its executor is closed here) or finds the node closed.
        with self._mount_lock:
            if self._tasks is not None:
                self._tasks.close()
            if self._arenas is not None:
                self._arenas.close()  # before the node: its connection carries the release
            self._node.close()
        if self._data is not None:
            self._data.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            log.warning("Store of %s was not closed; closing it now", self.master)
            with contextlib.suppress(Exception):
                self.close()

    def _open(self) -> DataPath:
        if self._closed or self._data is None:
            raise StoreClosed("this Store is closed")
        return self._data

    def health_check(self) -> HealthStatus:
        """HEALTHY when the master answers a Ping now, CLOSED after close(), else
        MASTER_UNREACHABLE."""
        if self._closed:
            return HealthStatus.CLOSED
        try:
            self._node.ping()
        except KVPoolError:
            return HealthStatus.MASTER_UNREACHABLE
        return HealthStatus.HEALTHY

    # ------------------------------------------------------------------ segments

    def mount_segment(self, size: int | str, *, path: str | None = None, offset: int = 0) -> str:
        """Contribute `size` more bytes (an int or "1GiB", at least a page) of this process's
        memory to the pool: a new pre-faulted segment, served by this Store's transfer server
        and remounted with the others when the master asks. Returns its name (usable in
        `ReplicateConfig.preferred_segments`). A Store made with `segment_size=0` starts
        serving and executing replica tasks with its first segment.

        With `path`, the segment is the bytes [offset, offset + size) of that regular file
        (`offset` page-aligned), shared with the file; same-host peers reach it over TCP, and
        the file must not shrink while mounted (`SegmentMemory.map_file`)."""
        data = self._open()
        return self._mount(data, size, path, offset)

    def _mount(
        self, data: DataPath, size: int | str, path: str | None = None, offset: int = 0
    ) -> str:
        with self._mount_lock:
            mem = self._node.mount(
                size, on_created=data.engine.attach_local, path=path, offset=offset
            )
            if self._tasks is None:
                # Owning a segment makes this process the executor of the replica tasks
                # whose source is here (pool-mode swap-out, copy/move tasks).
                self._tasks = TaskExecutor(
                    self._node, data, poll_interval=self._task_poll_interval
                ).start()
                self._node.on_pending_tasks = self._tasks.wake
        return mem.name

    def unmount_segment(self, name: str) -> None:
        """Take segment `name` out of the pool: the master unmounts it (and drops the
        replicas it held: an object that lived only there is gone), then this Store stops
        serving it and frees its memory. Raises `SegmentError` (SEGMENT_NOT_FOUND) for a
        name this Store did not mount; when the master cannot be told the segment stays
        mounted and the error is raised."""
        self._open()
        if not isinstance(name, str):
            raise InvalidParams(f"name: expected a str, got {type(name).__name__}")
        self._node.unmount(SegmentName(name), best_effort=False)

    def warm_up(self) -> int:
        """Open every segment of the pool now (map same-host shared memory, resolve the
        others), so that the first transfers do not pay for it: mapping a large peer segment
        costs a tenth of a second per GiB. Returns how many segments were opened."""
        engine = self._open().engine
        stats = _reply(self._node.rpc.call(Stats()), StatsReply)
        raise_for_code(stats.code, "Stats")
        opened = 0
        for seg in stats.segments:
            try:
                engine.open_segment(seg.name)
                opened += 1
            except KVPoolError as exc:
                log.info("warm_up: segment %s not reachable: %s", seg.name, exc)
        return opened

    # ------------------------------------------------------------------ buffers

    def register_buffer(self, buffer: Buffer | int, length: int | None = None) -> None:
        """Register memory for `put_from` / `get_into`: a buffer (kept alive until
        unregistered), or a raw address such as `tensor.data_ptr()` with its `length` (the
        caller keeps that memory alive). Overlapping an existing registration is
        INVALID_PARAMS."""
        self._open().engine.register(buffer, length)

    def unregister_buffer(self, buffer: Buffer | int) -> None:
        """Undo `register_buffer` (the same object, a view starting at its address, or the
        address)."""
        self._open().engine.unregister(buffer)

    def _registered(self, buffer: Buffer, *, writable: bool, what: str) -> memoryview:
        mv = byte_view(buffer, writable=writable, what=what)
        if mv.nbytes == 0:
            raise InvalidParams(f"{what}: the buffer is empty")
        if self._open().engine.registry.find(buffer_address(mv), mv.nbytes) is None:
            raise InvalidParams(
                f"{what}: {mv.nbytes} bytes at {buffer_address(mv):#x} are not inside memory "
                "registered with register_buffer()"
            )
        return mv

    # ------------------------------------------------------------------ put

    def put(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> bool:
        """Store `value` under `key` unless the key exists. True: stored; False: the key
        already existed and nothing was overwritten."""
        return self._put_one(_check_key(key), _value_view(value), config, upsert=False)

    def upsert(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> None:
        """Store `value` under `key`, replacing any value it had."""
        self._put_one(_check_key(key), _value_view(value), config, upsert=True)

    def put_from(self, key: str, buffer: Buffer, config: ReplicateConfig | None = None) -> bool:
        """`put` of a registered buffer's bytes, zero-copy (the buffer is the whole value)."""
        return self._put_one(
            _check_key(key),
            self._registered(buffer, writable=False, what="put_from buffer"),
            config,
            upsert=False,
        )

    def _put_one(
        self, key: str, mv: memoryview, config: ReplicateConfig | None, *, upsert: bool
    ) -> bool:
        self._open()
        cfg = _DEFAULT_MSG if config is None else config.to_msg()
        if not upsert and _arena_config(cfg):
            arenas = self._arenas
            if arenas is not None and mv.nbytes <= arenas.max_value:
                done = self._put_arena(arenas, key, mv, cfg)
                if done is not None:
                    return done
        rpc = self._node.rpc
        cid = self._node.client_id
        start = (UpsertStart if upsert else PutStart)(cid, key, mv.nbytes, cfg, self.tenant)
        rep = _reply(rpc.call(start), PutStartReply)
        if rep.code == ErrorCode.OBJECT_ALREADY_EXISTS and not upsert:
            return False
        raise_for_code(rep.code, key)
        try:
            code, csum = self._write_replicas(rep.replicas, mv)
        except BaseException:
            # Whatever escaped (a concurrent close(), KeyboardInterrupt, a fault of the data
            # path), the PutStart must not linger: for put_start_discard_timeout it would make
            # a retried put answer "already exists" and hold its space.
            self._revoke([key])
            raise
        if code != ErrorCode.OK:
            self._revoke([key])
            raise error_for_code(code, f"{key!r}: writing its replicas failed; the put was revoked")
        end = _reply(rpc.call(PutEnd(cid, key, csum, self.tenant)), Reply)
        raise_for_code(end.code, key)
        return True

    def _put_arena(
        self, arenas: Arenas, key: str, mv: memoryview, cfg: ReplicateConfigMsg
    ) -> bool | None:
        """`put` through an arena: True / False as `put`, None when it must take PutStart."""
        got = arenas.take([mv.nbytes])
        if got is None:
            return None
        arena, (off,) = got
        try:
            place = ReplicaDesc(
                0, _MEMORY, _PROCESSING, arena.segment, off, mv.nbytes, arena.endpoint
            )
            code, csum = self._write_replicas([place], mv)
            if code != ErrorCode.OK:
                log.debug("write into arena %s failed (%s); using PutStart", arena.segment, code)
                arenas.abandon(arena)
                return None
            commit = PutCommit(
                self._node.client_id, key, mv.nbytes, arena.arena_id, off, csum, cfg, self.tenant
            )
            sent = time.monotonic()
            answer = _reply(self._node.rpc.call(commit), Reply).code
            if answer in (_OK, _EXISTS):  # the master renewed the lease (it may for others)
                arenas.confirm(arena, sent)
        finally:
            arenas.done(arena)
        if answer == _OK:
            return True
        if answer == _EXISTS:
            return False
        if answer == _INVALID_WRITE:  # the master no longer knows the arena
            arenas.drop(arena)
            return None
        raise error_for_code(ErrorCode.of(answer), key)

    def _write_replicas(
        self, replicas: Sequence[ReplicaDesc], mv: memoryview
    ) -> tuple[ErrorCode, int | None]:
        """Write `mv` into every replica; the first failure (or OK) and the value's checksum."""
        code = self._check_replicas(replicas, mv.nbytes)
        if code != ErrorCode.OK:
            return code, None
        csum: int | None = None
        codes: list[ErrorCode] = []
        if len(replicas) == 1 and mv.nbytes < CHUNKED_MIN:
            # The common small put: copied here when the segment is mapped (hashed while in
            # the cache), by the engine otherwise.
            r = replicas[0]
            got, digests = self._open().move_many(
                TransferOp.WRITE, [mv], [r.segment], [r.offset], True
            )
            digest = digests[0]
            return got[0], _or_hash(digest, mv)
        if mv.nbytes >= CHUNKED_MIN:
            # Hash while writing the first replica, when it is mapped here.
            first = replicas[0]
            done = self._open().copy_hashing(TransferOp.WRITE, mv, first.segment, first.offset)
            if done is not None:
                codes, csum, replicas = [done[0]], done[1], replicas[1:]
        reqs = [TransferRequest(TransferOp.WRITE, mv, r.segment, r.offset) for r in replicas]
        codes += self._open().transfer(reqs)
        if csum is None:
            csum = checksum(mv)
        return next((c for c in codes if c != ErrorCode.OK), ErrorCode.OK), csum

    @staticmethod
    def _check_replicas(replicas: Sequence[ReplicaDesc], size: int) -> ErrorCode:
        if not replicas:
            return ErrorCode.NO_AVAILABLE_HANDLE
        for r in replicas:
            if r.size != size:
                return ErrorCode.INVALID_REPLICA
        return ErrorCode.OK

    def _revoke(self, keys: list[str]) -> None:
        """Best effort: free what PutStart took. If the master cannot be reached it revokes
        the put itself (put_start_discard_timeout, or when this client expires)."""
        rpc = self._node.rpc
        try:
            if len(keys) == 1:
                rpc.call(PutRevoke(self._node.client_id, keys[0], self.tenant))
            elif keys:
                rpc.call(BatchPutRevoke(self._node.client_id, keys, self.tenant))
        except KVPoolError as exc:
            log.warning("PutRevoke of %d key(s) failed: %s", len(keys), exc)

    def batch_put(
        self, keys: Sequence[str], values: Sequence[Buffer], config: ReplicateConfig | None = None
    ) -> list[ErrorCode]:
        """Put every (key, value); per key: OK (stored), OBJECT_ALREADY_EXISTS (kept the old
        value) or why it failed. Partial success is possible; failed keys leave no trace."""
        ks = _check_keys(keys, unique=True)
        views = self._batch_views(ks, values, _value_view)
        return self._put_batch(ks, views, config, upsert=False)

    def batch_upsert(
        self, keys: Sequence[str], values: Sequence[Buffer], config: ReplicateConfig | None = None
    ) -> list[ErrorCode]:
        """Upsert every (key, value); per key OK or why it failed."""
        ks = _check_keys(keys, unique=True)
        views = self._batch_views(ks, values, _value_view)
        return self._put_batch(ks, views, config, upsert=True)

    def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[Buffer], config: ReplicateConfig | None = None
    ) -> list[ErrorCode]:
        """`batch_put` from registered buffers, zero-copy."""
        ks = _check_keys(keys, unique=True)
        views = self._batch_views(
            ks, buffers, lambda b: self._registered(b, writable=False, what="put_from buffer")
        )
        return self._put_batch(ks, views, config, upsert=False)

    @staticmethod
    def _batch_views(
        keys: list[str], values: Sequence[Buffer], view: Callable[[Buffer], memoryview]
    ) -> list[memoryview]:
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise InvalidParams(f"values: expected a list of buffers, got {type(values).__name__}")
        if len(values) != len(keys):
            raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
        return [view(v) for v in values]

    def _put_batch(
        self,
        keys: list[str],
        views: list[memoryview],
        config: ReplicateConfig | None,
        *,
        upsert: bool,
    ) -> list[ErrorCode]:
        self._open()
        if not keys:
            return []
        if config is None:
            cfg = _DEFAULT_MSG
        else:
            config.check_batch(len(keys))
            cfg = config.to_msg()
        arenas = self._arenas
        if (
            not upsert
            and arenas is not None
            and _arena_config(cfg)
            and max(mv.nbytes for mv in views) <= arenas.max_value
        ):
            done = self._put_batch_arena(arenas, keys, views, cfg)
            if done is not None:
                return done
        return self._put_batch_started(keys, views, cfg, upsert=upsert)

    def _put_batch_arena(
        self,
        arenas: Arenas,
        keys: list[str],
        views: list[memoryview],
        cfg: ReplicateConfigMsg,
    ) -> list[ErrorCode] | None:
        """`batch_put` through one arena and one BatchPutCommit; None when the whole batch
        must take PutStart. Keys whose write failed or whose arena the master forgot are put
        again through PutStart."""
        sizes = [mv.nbytes for mv in views]
        got = arenas.take(sizes)
        if got is None:
            return None
        arena: Arena = got[0]
        offs = got[1]
        ok = ErrorCode.OK
        n = len(keys)
        try:
            codes, digests = self._open().move_many(
                TransferOp.WRITE, views, [arena.segment] * n, offs, True
            )
            out = list(codes)
            good = [i for i in range(n) if codes[i] == ok]
            if len(good) != n:
                arenas.abandon(arena)
            if good:
                every = len(good) == n
                sums = [_or_hash(digests[i], views[i]) for i in good]
                commit = BatchPutCommit(
                    self._node.client_id,
                    arena.arena_id,
                    keys if every else [keys[i] for i in good],
                    sizes if every else [sizes[i] for i in good],
                    offs if every else [offs[i] for i in good],
                    sums,
                    cfg,
                    self.tenant,
                )
                sent = time.monotonic()
                got_codes = _reply(self._node.rpc.call(commit), BatchReply).codes
                if any(c in (_OK, _EXISTS) for c in got_codes):
                    arenas.confirm(arena, sent)
                if len(got_codes) != len(good):
                    raise KVPoolError(
                        f"BatchPutCommit answered {len(got_codes)} codes for {len(good)} keys",
                        ErrorCode.RPC_FAIL,
                    )
                for i, c in zip(good, got_codes, strict=True):
                    out[i] = ErrorCode.of(c) if c else ok
        finally:
            arenas.done(arena)
        # Again through PutStart: what was never written, and what the master refused only
        # because it forgot the arena. Any other answer is the key's own.
        forgot = ErrorCode.INVALID_WRITE
        again = [i for i in range(n) if codes[i] != ok or out[i] == forgot]
        if any(out[i] == forgot for i in again):
            arenas.drop(arena)
        if again:
            redo = self._put_batch_started(
                [keys[i] for i in again], [views[i] for i in again], cfg, upsert=False
            )
            for i, c in zip(again, redo, strict=True):
                out[i] = c
        return out

    def _put_batch_started(
        self,
        keys: list[str],
        views: list[memoryview],
        cfg: ReplicateConfigMsg,
        *,
        upsert: bool,
    ) -> list[ErrorCode]:
        """`batch_put` / `batch_upsert` through BatchPutStart and BatchPutEnd."""
        rpc = self._node.rpc
        cid = self._node.client_id
        sizes = [mv.nbytes for mv in views]
        kind = BatchUpsertStart if upsert else BatchPutStart
        rep = _reply(rpc.call(kind(cid, keys, sizes, cfg, self.tenant)), BatchPutStartReply)
        if len(rep.results) != len(keys):
            raise KVPoolError(
                f"BatchPutStart answered {len(rep.results)} results for {len(keys)} keys",
                ErrorCode.RPC_FAIL,
            )
        # One pass over the results builds the places to write (parallel lists: this loop
        # runs once per key of every batch); `want` marks each key's first replica, whose copy
        # is hashed while the value is in the cache.
        ok = ErrorCode.OK
        out = [ok] * len(keys)
        started: list[int] = []
        places: list[memoryview] = []
        segs: list[str] = []
        offs: list[int] = []
        owner: list[int] = []
        want: list[bool] = []
        for i, r in enumerate(rep.results):
            if r.code:
                out[i] = ErrorCode.of(r.code)
                continue
            started.append(i)
            size = sizes[i]
            replicas = r.replicas
            if len(replicas) == 1:  # the common case, without the general loop below
                d = replicas[0]
                if d.size != size:
                    out[i] = ErrorCode.INVALID_REPLICA
                    continue
                places.append(views[i])
                segs.append(d.segment)
                offs.append(d.offset)
                owner.append(i)
                want.append(True)
                continue
            if not replicas or any(d.size != size for d in replicas):
                out[i] = self._check_replicas(replicas, size)
                continue
            view = views[i]
            head = True
            for d in replicas:
                places.append(view)
                segs.append(d.segment)
                offs.append(d.offset)
                owner.append(i)
                want.append(head)
                head = False
        try:
            codes, digests = self._open().move_many(TransferOp.WRITE, places, segs, offs, want)
            sums: dict[int, int] = {}
            for i, first, taken in zip(owner, want, digests, strict=True):
                if first:
                    sums[i] = _or_hash(taken, views[i])
        except BaseException:
            self._revoke([keys[i] for i in started])
            raise
        for i, code in zip(owner, codes, strict=True):
            if code != ok and out[i] == ok:
                out[i] = code
        good = [i for i in started if out[i] == ok]
        if len(good) != len(started):
            self._revoke([keys[i] for i in started if out[i] != ok])
        if good:
            good_keys = keys if len(good) == len(keys) else [keys[i] for i in good]
            end = rpc.call(BatchPutEnd(cid, good_keys, [sums[i] for i in good], self.tenant))
            codes_end = _reply(end, BatchReply).codes
            for i, c in zip(good, codes_end, strict=True):
                if c:
                    out[i] = ErrorCode.of(c)
        return out

    # ------------------------------------------------------------------ get

    def get(self, key: str) -> bytearray:
        """The value of `key`, read into a buffer allocated once for it (a bytearray, which
        compares equal to the bytes that were put). Raises `ObjectNotFound`."""
        key = _check_key(key)
        self._open()
        started = time.monotonic()
        rl = _reply(self._node.rpc.call(GetReplicaList(key, self.tenant)), ReplicaListReply)
        raise_for_code(rl.code, key)
        out = bytearray(rl.size)
        self._read(key, rl, memoryview(out), lease_deadline(started, rl.lease_ttl_ms))
        return out

    def get_into(self, key: str, buffer: Buffer) -> int:
        """Read `key` into the registered `buffer` (zero-copy); returns the value's size.
        A buffer smaller than the value is INVALID_PARAMS and nothing is read."""
        key = _check_key(key)
        mv = self._registered(buffer, writable=True, what="get_into buffer")
        started = time.monotonic()
        rl = _reply(self._node.rpc.call(GetReplicaList(key, self.tenant)), ReplicaListReply)
        raise_for_code(rl.code, key)
        if rl.size > mv.nbytes:
            raise InvalidParams(f"{key!r}: buffer of {mv.nbytes} bytes for a {rl.size}-byte value")
        self._read(key, rl, mv[: rl.size], lease_deadline(started, rl.lease_ttl_ms))
        return rl.size

    def _read(
        self,
        key: str,
        rl: ReplicaListReply,
        dest: memoryview,
        deadline: float,
        order: list[ReplicaDesc] | None = None,
    ) -> None:
        """Read the object of `rl` into `dest`, trying the replicas of `order` (default: all
        of them, best first; see the module docstring); raises the last replica's failure."""
        if order is None:
            order = order_replicas(rl.replicas, self._open().is_local)
        if not order:
            raise error_for_code(ErrorCode.REPLICA_IS_NOT_READY, f"{key!r}: no readable replica")
        failure: KVPoolError | None = None
        verify = self.verify_checksum and rl.checksum is not None
        for r in order:
            done: tuple[ErrorCode, int | None] | None = None
            if verify and dest.nbytes >= CHUNKED_MIN:
                done = self._open().copy_hashing(TransferOp.READ, dest, r.segment, r.offset)
            elif dest.nbytes < CHUNKED_MIN:  # copied here when mapped, hashed while in cache
                got, digests = self._open().move_many(
                    TransferOp.READ, [dest], [r.segment], [r.offset], verify
                )
                done = got[0], digests[0]
            if done is not None:
                code, digest = done
            else:
                req = TransferRequest(TransferOp.READ, dest, r.segment, r.offset)
                code, digest = self._open().transfer([req])[0], None
            if code != ErrorCode.OK:
                failure = error_for_code(code, f"{key!r}: reading replica on {r.segment} failed")
                continue
            if verify:
                try:
                    verify_checksum(key, dest, rl.checksum, digest)
                except ChecksumMismatch as exc:
                    failure = exc
                    continue
            verify_lease(key, deadline)
            return
        raise failure or TransferError(f"{key!r}: every replica failed")

    def batch_get(self, keys: Sequence[str]) -> list[bytearray | None]:
        """The values of `keys`, None for each key that does not exist. Any other per-key
        failure (transfer, checksum, lease) raises once the whole batch is done."""
        ks = _check_keys(keys, unique=False)
        self._open()
        if not ks:
            return []
        started = time.monotonic()
        loc = self._locations(ks)
        fast = self._batch_get_mapped(loc, started)
        if fast is not None:
            return fast
        out: list[bytearray | None] = []
        dests: list[memoryview | None] = []
        for code, size in zip(loc.codes, loc.sizes, strict=True):
            if code == 0:
                buf = bytearray(size)
                out.append(buf)
                dests.append(memoryview(buf))
            else:
                out.append(None)
                dests.append(None)
        codes = self._read_batch(ks, loc, dests, started)
        first: KVPoolError | None = None
        for i, code in enumerate(codes):
            if code == ErrorCode.OBJECT_NOT_FOUND:
                out[i] = None
            elif code != ErrorCode.OK:
                out[i] = None
                first = first or error_for_code(code, f"{ks[i]!r}")
        if first is not None:
            raise first
        return out

    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Buffer]) -> list[int]:
        """Read each key into its registered buffer; per key the bytes read, or a negative
        `ErrorCode` value (OBJECT_NOT_FOUND, INVALID_PARAMS for a buffer too small, ...),
        as Mooncake's batch_get_into."""
        ks = _check_keys(keys, unique=False)
        self._open()
        if isinstance(buffers, str | bytes) or not isinstance(buffers, Sequence):
            raise InvalidParams("buffers: expected a list of registered buffers")
        if len(buffers) != len(ks):
            raise InvalidParams(f"{len(ks)} keys but {len(buffers)} buffers")
        views = [self._registered(b, writable=True, what="get_into buffer") for b in buffers]
        if not ks:
            return []
        started = time.monotonic()
        loc = self._locations(ks)
        sizes = loc.sizes
        dests: list[memoryview | None] = [None] * len(ks)
        early: dict[int, ErrorCode] = {}
        for i, code in enumerate(loc.codes):
            if code != 0:
                continue
            if sizes[i] > views[i].nbytes:
                early[i] = ErrorCode.INVALID_PARAMS
            else:
                dests[i] = views[i][: sizes[i]]
        codes = self._read_batch(ks, loc, dests, started)
        out: list[int] = []
        for i, code in enumerate(codes):
            final = early.get(i, code)
            out.append(sizes[i] if final == ErrorCode.OK else int(final))
        return out

    def _batch_get_mapped(
        self, loc: LocationsReply, started: float
    ) -> list[bytearray | None] | None:
        """`batch_get`'s fast path, for its common case: every key found or missing, each with
        one replica, all on one segment mapped here. One loop under one hold of the mapping:
        each value is copied straight into its new bytearray (no zero-filling first) and
        hashed while it is still in the cache. None when anything is off the common case (the
        general path then does the whole batch, reads again included)."""
        if len(loc.segments) != 1:
            return None
        hold = self._open().hold_mapped(loc.segments[0])
        if hold is None:
            return None
        digest = xxhash.xxh3_64_intdigest
        verify = self.verify_checksum
        sums, sizes, places = loc.checksums, loc.sizes, loc.places
        out: list[bytearray | None] = []
        with hold:
            mem = hold.buffer
            cap = mem.nbytes
            for i, code in enumerate(loc.codes):
                if code:
                    if code != _NOT_FOUND:
                        return None
                    out.append(None)
                    continue
                p = places[i]
                if len(p) != 2 or p[0] != 0:
                    return None
                off = p[1]
                end = off + sizes[i]
                if off < 0 or end > cap or end < off:
                    return None  # a malformed answer: the general path reports it
                buf = bytearray(mem[off:end])
                want = sums[i]
                if verify and want is not None and digest(buf) != want:
                    return None  # the general path tells which key and why
                out.append(buf)
        if time.monotonic() > lease_deadline(started, loc.lease_ttl_ms):
            return None
        return out

    def _locations(self, keys: list[str]) -> LocationsReply:
        loc = _reply(self._node.rpc.call(BatchGetLocations(keys, self.tenant)), LocationsReply)
        n = len(keys)
        if not len(loc.codes) == len(loc.sizes) == len(loc.checksums) == len(loc.places) == n:
            raise KVPoolError(
                f"BatchGetLocations answered {len(loc.codes)} results for {n} keys",
                ErrorCode.RPC_FAIL,
            )
        if len(loc.endpoints) != len(loc.segments):
            raise KVPoolError(
                "BatchGetLocations: segments and endpoints differ", ErrorCode.RPC_FAIL
            )
        # What the loops index without checking: sizes (buffers are made from them) and the
        # (segment, offset) pairs of places. Offsets and segment indexes are checked where used.
        if (n and min(loc.sizes) < 0) or any(len(p) & 1 for p in loc.places):
            raise KVPoolError("BatchGetLocations: malformed sizes or places", ErrorCode.RPC_FAIL)
        return loc

    def _read_batch(
        self,
        keys: list[str],
        loc: LocationsReply,
        dests: list[memoryview | None],
        started: float,
    ) -> list[ErrorCode]:
        """Read every key that has a destination: first choices in one batch, then the keys
        whose first choice failed one by one through their other replicas.

        This loop runs once per key of every batch, so it stays plain: codes are converted
        only when not OK, the clock is read once for the whole batch, and the parallel lists
        of the `LocationsReply` are read as they came (no object per key).
        """
        ok = ErrorCode.OK
        data = self._open()
        segments = loc.segments
        n_segs = len(segments)
        first_of = self._first_places(loc, data.is_local)
        codes = [ok] * len(dests)
        places: list[memoryview] = []
        segs: list[str] = []
        offs: list[int] = []
        owner: list[int] = []
        bad_place = False
        for i, code in enumerate(loc.codes):
            if code != 0:
                codes[i] = ErrorCode.of(code)
                continue
            dest = dests[i]
            if dest is None:
                codes[i] = ErrorCode.INVALID_PARAMS  # a size check refused it
                continue
            p = loc.places[i]
            if not p:
                codes[i] = ErrorCode.REPLICA_IS_NOT_READY
                continue
            j = first_of[i] if first_of else 0
            seg = p[j]
            if not 0 <= seg < n_segs or p[j + 1] < 0:
                bad_place = True
                codes[i] = ErrorCode.RPC_FAIL
                continue
            places.append(dest)
            segs.append(segments[seg])
            offs.append(p[j + 1])
            owner.append(i)
        if bad_place:
            log.warning("BatchGetLocations named a segment index out of range")
        verify = self.verify_checksum
        done, digests = data.move_many(TransferOp.READ, places, segs, offs, verify)
        deadline = lease_deadline(started, loc.lease_ttl_ms)
        late = time.monotonic() > deadline  # one clock read for the whole batch
        sums = loc.checksums
        for i, code, taken, dest in zip(owner, done, digests, places, strict=True):
            want = sums[i]
            if code == ok and (not verify or want is None or _or_hash(taken, dest) == want):
                if late:
                    codes[i] = ErrorCode.LEASE_EXPIRED  # late on every replica: final
                continue
            codes[i] = code if code != ok else ErrorCode.CHECKSUM_MISMATCH
            # The rare path: the first choice failed; try the others one by one.
            others = self._replica_list(loc, i, skip=first_of[i] if first_of else 0)
            if others.replicas:
                try:
                    self._read(keys[i], others, dest, deadline, others.replicas)
                    codes[i] = ok
                except KVPoolError as exc:
                    codes[i] = exc.code
        return codes

    @staticmethod
    def _first_places(
        loc: LocationsReply, is_local: Callable[[SegmentName], bool]
    ) -> list[int] | None:
        """Per key, the index in its places of the replica to read first (the first one on
        this host, as `order_replicas`), or None when every key has at most one replica."""
        if all(len(p) <= 2 for p in loc.places):
            return None
        segments = loc.segments
        local = [is_local(SegmentName(name)) for name in segments]
        first: list[int] = []
        for p in loc.places:
            j = 0
            for k in range(0, len(p), 2):
                if 0 <= p[k] < len(local) and local[p[k]]:
                    j = k
                    break
            first.append(j)
        return first

    @staticmethod
    def _replica_list(loc: LocationsReply, i: int, skip: int) -> ReplicaListReply:
        """Key `i` of `loc` as a ReplicaListReply, without the replica at `skip` (the one that
        failed), for the one-by-one retry through `_read`."""
        p = loc.places[i]
        descs = [
            ReplicaDesc(
                0,
                _MEMORY,
                ReplicaStatus.COMPLETE,
                loc.segments[p[k]],
                p[k + 1],
                loc.sizes[i],
                loc.endpoints[p[k]],
            )
            for k in range(0, len(p), 2)
            if k != skip and 0 <= p[k] < len(loc.segments) and p[k + 1] >= 0
        ]
        return ReplicaListReply(0, descs, loc.sizes[i], loc.checksums[i], loc.lease_ttl_ms)

    # ------------------------------------------------------------------ queries

    def exists(self, key: str) -> bool:
        """Whether `key` has a readable value (grants a read lease, as Mooncake's)."""
        key = _check_key(key)
        self._open()
        rep = _reply(self._node.rpc.call(ExistKey(key, self.tenant)), ExistReply)
        raise_for_code(rep.code, key)
        return rep.exists

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        ks = _check_keys(keys, unique=False)
        self._open()
        if not ks:
            return []
        rep = _reply(self._node.rpc.call(BatchExistKey(ks, self.tenant)), BatchExistReply)
        out = []
        for k, r in zip(ks, rep.results, strict=True):
            if r.code not in (ErrorCode.OK, ErrorCode.OBJECT_NOT_FOUND):
                raise_for_code(r.code, k)
            out.append(r.exists and r.code == ErrorCode.OK)
        return out

    def get_size(self, key: str) -> int:
        """The size in bytes of `key`'s value; raises `ObjectNotFound`."""
        key = _check_key(key)
        self._open()
        rep = _reply(self._node.rpc.call(GetSize(key, self.tenant)), SizeReply)
        raise_for_code(rep.code, key)
        return rep.size

    # ------------------------------------------------------------------ remove

    def remove(self, key: str, force: bool = False) -> None:
        """Remove `key`. Raises `ObjectNotFound`, or `ObjectHasLease` while a reader holds a
        lease on it (unless `force`)."""
        key = _check_key(key)
        self._open()
        rep = _reply(self._node.rpc.call(Remove(key, bool(force), self.tenant)), Reply)
        raise_for_code(rep.code, key)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[ErrorCode]:
        """Remove every key; per key OK or why not (OBJECT_NOT_FOUND, OBJECT_HAS_LEASE, ...)."""
        ks = _check_keys(keys, unique=False)
        self._open()
        if not ks:
            return []
        rep = _reply(self._node.rpc.call(BatchRemove(ks, bool(force), self.tenant)), BatchReply)
        return [_code(c) for c in rep.codes]

    def remove_all(self, force: bool = False) -> int:
        """Remove every object of this tenant (leased ones only with `force`); returns how
        many were removed."""
        self._open()
        rep = _reply(self._node.rpc.call(RemoveAll(bool(force), self.tenant)), CountReply)
        raise_for_code(rep.code, "RemoveAll")
        return rep.count

    def remove_by_regex(self, pattern: str, force: bool = False) -> int:
        """Remove the keys in which `pattern` (Python `re`) is found; returns the count."""
        if not isinstance(pattern, str) or not pattern:
            raise InvalidParams(
                f"pattern: expected a non-empty regular expression, got {pattern!r}"
            )
        import re

        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidParams(f"pattern {pattern!r}: {exc}") from exc
        self._open()
        rep = _reply(
            self._node.rpc.call(RemoveByRegex(pattern, bool(force), self.tenant)), CountReply
        )
        raise_for_code(rep.code, f"RemoveByRegex {pattern!r}")
        return rep.count
