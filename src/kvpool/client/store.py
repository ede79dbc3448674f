"""`Store`: the synchronous, thread-safe client of a kvpool pool (`kvpool.Store`).

A Store owns two things: a `NodeRuntime` (its client id, the control-plane connection to the
master, its heartbeat and, with `segment_size > 0`, a segment of this process's memory mounted
into the pool) and a `DataPath` (the `TransferEngine` — memcpy for its own segment, a mapping of
the owner's shared memory on this host, TCP to other hosts — plus a cache of segment locations
and the same-host fast paths). This module is the public API, a façade over the parts that do
the work:

    config.py      StoreConfig: every setting, frozen and validated (`Store.from_config`)
    validation.py  the caller's input, checked before anything is sent
    writer/        Writer: put / upsert / put_from and the batch forms (PutStart/PutEnd, arenas)
    reader.py      Reader: get / get_into and the batch forms (the mapped fast path included)
    control.py     Control: exists, sizes, removal, replica tasks and descriptors
    tasks.py       TaskExecutor: with a segment, runs the replica tasks the master assigns here

The parts share the node, the data path and the tenant and keep no state between calls.

Values are copied once, straight between the caller's memory and segment memory: `put` writes
from the value's own buffer, `get` allocates its result once and reads into it, `put_from` and
`get_into` use memory registered with `register_buffer` (the zero-copy API, as Mooncake's).

Errors: bad input raises `InvalidParams` before anything is sent; master outcomes become the
exception of their code (`ObjectNotFound`, `NoSpace`, `ObjectHasLease`, ...); a batch answer of
the wrong length is `RpcError` (RPC_FAIL); a call after `close()` raises `StoreClosed` (the real
Mooncake segfaults there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import cast

from kvpool.client import dfs
from kvpool.client.arena import Arenas
from kvpool.client.config import DEFAULT_TRANSFER_TIMEOUT_S, Protocol, StoreConfig, WriteMode
from kvpool.client.control import Control, TaskInfo
from kvpool.client.datapath import DataPath
from kvpool.client.disk import DiskTier
from kvpool.client.drain import drain_node
from kvpool.client.hotcache import HotCache
from kvpool.client.invalidation import Invalidations
from kvpool.client.leader import DEFAULT_FAILOVER_TIMEOUT_S
from kvpool.client.locations import (
    DEFAULT_LOCATION_CAPACITY,
    DEFAULT_LOCATION_TTL_S,
    Locations,
    ReadMode,
)
from kvpool.client.metrics import StoreMetrics, metered
from kvpool.client.node import DEFAULT_RPC_TIMEOUT_S, MIN_SEGMENT_SIZE, NodeRuntime
from kvpool.client.pending import PendingCommits
from kvpool.client.reader import Reader
from kvpool.client.replicate import ReplicateConfig
from kvpool.client.result import PutResult, PutStats
from kvpool.client.tasks import DEFAULT_POLL_INTERVAL_S, TaskExecutor, TaskStats
from kvpool.client.validation import (
    MAX_KEY_BYTES,
    Buffer,
    batch_views,
    check_key,
    check_keys,
    check_pattern,
    check_segment_size,
    check_values,
    registered_view,
    registered_views,
    value_view,
)
from kvpool.client.writer import Writer
from kvpool.config import parse_size
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, StoreClosed, raise_for_code
from kvpool.protocol.drain import DrainReply
from kvpool.protocol.messages import ReplicaDesc, SegmentName, Stats, StatsReply, TenantId
from kvpool.rpc.auth import client_token
from kvpool.rpc.client import RpcClient
from kvpool.rpc.spin import DEFAULT_REPLY_POLL_S
from kvpool.rpc.tls import TlsConfig
from kvpool.transfer.registration import MemoryRegistry
from kvpool.transfer.serving import ServeCounters

__all__ = [
    "DEFAULT_TRANSFER_TIMEOUT_S",
    "MAX_KEY_BYTES",
    "Buffer",
    "HealthStatus",
    "PutResult",
    "PutStats",
    "Store",
    "StoreConfig",
]

log = logging.getLogger(__name__)


class HealthStatus(IntEnum):
    """`Store.health_check()` (Mooncake's numbers: 0 healthy, 1 closed, 2 master unreachable)."""

    HEALTHY = 0
    CLOSED = 1
    MASTER_UNREACHABLE = 2


class _Gate:
    """The Store's data path while it is open; `open()` is what every part calls first.

    The parts hold this gate's bound `open`, not the Store: a Store dropped without `close()`
    is then collected (and closed by `__del__`) at once, as no cycle keeps it alive."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data: DataPath | None = None

    def open(self) -> DataPath:
        data = self.data
        if data is None:
            raise StoreClosed("this Store is closed")
        return data


class Store:
    """A client of the pool at `master` (see the module docstring); use as a context manager.

    The keyword arguments are the fields of `StoreConfig` (each documented there), in
    Mooncake's `setup` order: `segment_size` and `arena_size` (bytes, an int or "4GiB"),
    `local_buffer_size` (accepted for Mooncake compatibility, only validated), `host`, `tenant`,
    `protocol` ("auto", "shm" or "tcp"), `verify_checksum`, `rpc_timeout`, `transfer_timeout`,
    `heartbeat_interval`, `cluster_id`, `task_poll_interval`, `failover_timeout`, `busy_poll` (s),
    `token` / `token_file` (the credential for a master with an auth file; else
    $KVPOOL_AUTH_TOKEN), `tls_ca` / `tls_cert` / `tls_key` (TLS on every TCP connection;
    else $KVPOOL_TLS_*).
    `master` is "host:port", or `etcd://HOST:PORT[,...]/CLUSTER_ID` to follow the leader of a
    highly available cluster (`kvpool.client.leader`). `Store.from_config`
    takes a `StoreConfig` instead.
    """

    def __init__(
        self,
        master: str = "127.0.0.1:50051",
        *,
        segment_size: int | str = 0,
        local_buffer_size: int | str = 0,
        host: str = "127.0.0.1",
        transfer_port_range: tuple[int, int] | None = None,
        tenant: str = "default",
        protocol: str = "auto",
        verify_checksum: bool = True,
        rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S,
        transfer_timeout: float = DEFAULT_TRANSFER_TIMEOUT_S,
        heartbeat_interval: float = 1.0,
        cluster_id: str = "kvpool",
        task_poll_interval: float = DEFAULT_POLL_INTERVAL_S,
        arena_size: int | str = "64MiB",
        failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT_S,
        offload_dir: str | None = None,
        offload_size: int | str = 0,
        disk_check_interval: float | None = None,
        disk_check_per_round: int | None = None,
        disk_check_bytes_per_round: int | str | None = None,
        dfs_root: str | None = None,
        dfs_fsync: bool = False,
        token: str = "",
        token_file: str = "",
        read_mode: str = "strict",
        location_ttl: float = DEFAULT_LOCATION_TTL_S,
        location_capacity: int = DEFAULT_LOCATION_CAPACITY,
        hot_cache_size: int | str = 0,
        write_mode: str = "wait",
        metrics: bool = False,
        busy_poll: float = DEFAULT_REPLY_POLL_S,
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
    ) -> None:
        self._closed = True  # until fully set up, so close() from a failed __init__ is safe
        config = StoreConfig(
            master=master,
            segment_size=parse_size(segment_size, name="segment_size"),
            local_buffer_size=parse_size(local_buffer_size, name="local_buffer_size"),
            host=host,
            transfer_port_range=transfer_port_range,
            tenant=tenant,
            protocol=cast(Protocol, protocol),
            verify_checksum=verify_checksum,
            rpc_timeout=rpc_timeout,
            transfer_timeout=transfer_timeout,
            heartbeat_interval=heartbeat_interval,
            cluster_id=cluster_id,
            task_poll_interval=task_poll_interval,
            arena_size=parse_size(arena_size, name="arena_size"),
            failover_timeout=failover_timeout,
            offload_dir=offload_dir,
            offload_size=parse_size(offload_size, name="offload_size"),
            disk_check_interval=disk_check_interval,
            disk_check_per_round=disk_check_per_round,
            disk_check_bytes_per_round=cast(int | None, disk_check_bytes_per_round),
            dfs_root=dfs_root,
            dfs_fsync=dfs_fsync,
            token=token,
            token_file=token_file,
            read_mode=cast(ReadMode, read_mode),
            location_ttl=location_ttl,
            location_capacity=location_capacity,
            write_mode=cast(WriteMode, write_mode),
            hot_cache_size=parse_size(hot_cache_size, name="hot_cache_size"),
            metrics=metrics,
            busy_poll=busy_poll,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        self._setup(config)

    @classmethod
    def from_config(cls, config: StoreConfig) -> Store:
        """A Store with the settings of `config`."""
        if not isinstance(config, StoreConfig):
            raise InvalidParams(f"config: expected a StoreConfig, got {type(config).__name__}")
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        return cls(**fields)

    def _setup(self, config: StoreConfig) -> None:
        self._config = config
        self._gate = _Gate()
        self._arenas: Arenas | None = None
        self._data: DataPath | None = None
        self._tasks: TaskExecutor | None = None
        self._disk: DiskTier | None = None
        self._mount_lock = threading.Lock()
        self._locations: Locations | None = None
        self._pending: PendingCommits | None = None
        self._invalidations: Invalidations | None = None
        self._hot: HotCache | None = None
        self._dfs: dfs.Attachment | None = None
        self._node = NodeRuntime(
            config.master,
            host=config.host,
            transfer_ports=config.transfer_port_range,
            rpc_timeout=config.rpc_timeout,
            heartbeat_interval=config.heartbeat_interval,
            cluster_id=config.cluster_id,
            name="kvpool-store",
            failover_timeout=config.failover_timeout,
            token=client_token(config.token, config.token_file),
            tls=TlsConfig.resolve(config.tls_cert, config.tls_key, config.tls_ca),
            reply_poll=config.busy_poll,
        )
        try:
            if config.dfs_root is not None or config.dfs_fsync:  # tiers: this process's DFS
                self._dfs = dfs.attach(config.dfs_root, fsync=config.dfs_fsync)
            self._data = DataPath(self._node, config.protocol, config.transfer_timeout)
            self._node.start()
            node = self._node
            self._arenas = Arenas(node, node.client_id, config.arena_size)
            node.on_heartbeat = self._arenas.on_heartbeat
            tenant = TenantId(config.tenant)
            if config.tenant == "default" and node.rpc.auth_tenant:
                # A token names its tenant: a Store left at the default acts in it.
                tenant = TenantId(node.rpc.auth_tenant)
            opened = self._gate.open
            self._writer = Writer(node, opened, self._arenas, tenant, config.rpc_timeout)
            if config.read_mode == "cached":
                locations = Locations(config.location_ttl, config.location_capacity)
                self._locations = locations
                if config.hot_cache_size:
                    self._hot = HotCache(config.hot_cache_size, config.location_ttl)
                stream = Invalidations(lambda: node.rpc, tenant, self._forget, self._clear)
                locations.refresh = stream.refresh
                stream.start()
                self._invalidations = stream
            self._reader = Reader(node, opened, tenant, config.verify_checksum, self._locations)
            self._reader.hot = self._hot
            self._writer.locations = self._locations
            # Unwaited commits need one connection that keeps its order: not a failover client
            # (a leader switch settles commits by asking again), there puts wait as before.
            if config.write_mode == "nowait" and type(node.rpc) is RpcClient:
                self._pending = PendingCommits(lambda: node.rpc)
                self._writer.pending = self._pending
            self._metrics = metered(self, config.metrics)  # kvpool.client.metrics
            self._control = Control(node, opened, tenant)
            if config.segment_size > 0:
                self._mount(self._data, config.segment_size)
            if config.offload_dir is not None:
                self._mount_disk(self._data, config.offload_dir, config.offload_size)
        except BaseException:
            self._teardown()
            raise
        self._gate.data = self._data
        self._closed = False

    # ------------------------------------------------------------------ settings

    @property
    def config(self) -> StoreConfig:
        """The settings this Store was made with."""
        return self._config

    @property
    def master(self) -> str:
        return self._config.master

    @property
    def tenant(self) -> TenantId:
        return TenantId(self._config.tenant)

    @property
    def protocol(self) -> Protocol:
        return self._config.protocol

    @property
    def transfer_timeout(self) -> float:
        return self._config.transfer_timeout

    @property
    def verify_checksum(self) -> bool:
        """Whether reads are checked against the checksum recorded at PutEnd (settable)."""
        return self._reader.verify

    @verify_checksum.setter
    def verify_checksum(self, value: bool) -> None:
        self._reader.verify = bool(value)

    # ------------------------------------------------------------------ lifecycle

    @property
    def client_id(self) -> str:
        return self._node.client_id

    @property
    def segments(self) -> list[str]:
        """Names of the segments this Store has mounted now, oldest first (a copy)."""
        return list(self._node.segments)

    def close(self) -> None:
        """Unmount this process's segments, stop the heartbeat and every thread. Idempotent.
        With `write_mode="nowait"` the commits still in flight are taken first: a failed one
        raises `DeferredPutError` once the Store is closed."""
        if self._closed:
            return
        failure: KVPoolError | None = None
        if self._pending is not None:
            try:
                self._pending.flush()
            except KVPoolError as exc:
                failure = exc
        self._closed = True
        self._gate.data = None
        self._teardown()
        if failure is not None:
            raise failure

    def flush(self) -> None:
        """Wait for the commits of puts that did not wait (`write_mode="nowait"`) and raise
        the first failure among them (`DeferredPutError`, naming its key); nothing to do in
        the default mode."""
        self._open()
        if self._pending is not None:
            self._pending.flush()

    def _settle(self) -> None:
        """The start of every call in nowait mode: failures of earlier puts whose answers are
        here raise now (`kvpool.client.pending`)."""
        pending = self._pending
        if pending is not None and len(pending):
            pending.settle()

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
            if self._disk is not None:
                self._disk.close()
        if self._data is not None:
            self._data.close()
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.close()  # the disk-tier files it reads with preadv
        if self._dfs is not None:
            dfs.detach(self._dfs)
            self._dfs = None

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
        """The data path, or `StoreClosed` after close() (`_Gate.open`, inlined)."""
        data = self._gate.data
        if data is None:
            raise StoreClosed("this Store is closed")
        return data

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
        nbytes = parse_size(size, name="size", minimum=MIN_SEGMENT_SIZE)
        if path is not None and not isinstance(path, str):
            raise InvalidParams(f"path: expected a str or None, got {path!r}")
        if path is None:
            check_segment_size(nbytes, "size")
        return self._mount(data, nbytes, path, offset)

    def _mount(
        self, data: DataPath, size: int | str, path: str | None = None, offset: int = 0
    ) -> str:
        with self._mount_lock:
            try:
                mem = self._node.mount(
                    size, on_created=data.engine.attach_local, path=path, offset=offset
                )
            except OSError as exc:  # the transfer server cannot bind `host`
                raise InvalidParams(
                    f"host: cannot serve this Store's segments on {self._config.host!r}: "
                    f"{exc.strerror or exc}"
                ) from exc
            if self._tasks is None:
                # Owning a segment makes this process the executor of the replica tasks
                # whose source is here (pool-mode swap-out, copy/move tasks).
                self._tasks = TaskExecutor(
                    self._node, data, poll_interval=self._config.task_poll_interval
                ).start()
                self._node.on_pending_tasks = self._tasks.wake
        return mem.name

    def _mount_disk(self, data: DataPath, directory: str, size: int) -> None:
        """Open the disk tier in `directory`, mount it, register what it holds; this Store
        then executes the offload and promotion tasks that touch it (docs/parts/tiers.md)."""
        with self._mount_lock:
            disk = self._disk = DiskTier(directory, size, **self._config.disk_check())
            disk.mount(self._node, data.engine.attach_local)
            if self._tasks is None:
                self._tasks = TaskExecutor(
                    self._node, data, poll_interval=self._config.task_poll_interval
                ).start()
                self._node.on_pending_tasks = self._tasks.wake
            self._tasks.on_written = disk.on_task_written
            self._tasks.on_disk_freed = disk.on_freed

    @property
    def task_stats(self) -> TaskStats | None:
        """What this Store's replica task executor did (None before it owns a segment)."""
        return self._tasks.stats if self._tasks is not None else None

    @property
    def disk_tier(self) -> DiskTier | None:
        """This Store's disk tier (None without `offload_dir`)."""
        return self._disk

    @property
    def served(self) -> ServeCounters | None:
        """What this Store's transfer server served peers (None before it owns a segment)."""
        return None if (server := self._node.transfer_server) is None else server.counters()

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

    def drain_segment(
        self, name: str, grace: float = 30.0, on_started: Callable[[], None] | None = None
    ) -> DrainReply:
        """Gracefully unmount segment `name` of this Store: the master places nothing new there
        at once, moves out what must not be lost (this Store's task executor copies it), waits
        for read leases up to `grace` seconds and unmounts it; this Store polls its progress
        (`client/drain.py`), then stops serving it and frees its memory. Answers the last
        progress (`state` "done" when the master unmounted it; the memory is freed in any
        case). Raises `SegmentError` (SEGMENT_NOT_FOUND) for a name this Store did not mount.
        `on_started()` runs once the master has taken the drain (`drain_node`)."""
        self._open()
        if not isinstance(name, str):
            raise InvalidParams(f"name: expected a str, got {type(name).__name__}")
        if grace < 0:
            raise InvalidParams(f"grace: {grace} is negative")
        seg = SegmentName(name)
        if seg not in self._node.segments:
            raise_for_code(int(ErrorCode.SEGMENT_NOT_FOUND), f"drain_segment {name}")
        reply = drain_node(self._node, grace, [seg], on_started).get(seg, DrainReply(-1))
        self._node.unmount(seg, best_effort=True)
        return reply

    def warm_up(self) -> int:
        """Open every segment of the pool now (map same-host shared memory, resolve the
        others), so that the first transfers do not pay for it: mapping a large peer segment
        takes time in proportion to its size. Returns how many segments were opened."""
        engine = self._open().engine
        stats = self._node.rpc.call_as(Stats(), StatsReply)
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

    def _registered(
        self, buffers: Sequence[Buffer], *, writable: bool, what: str
    ) -> list[memoryview]:
        """`registered_views` of `buffers` (a view cut from a pinned buffer: one lookup)."""
        return registered_views(self._registry(), buffers, writable=writable, what=what)

    def _registry(self) -> MemoryRegistry:
        return self._open().engine.registry

    # ------------------------------------------------------------------ put (writer.py)

    def put(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> bool:
        """Store `value` under `key` unless the key exists. True: stored; False: the key
        already existed and nothing was overwritten. A put stored with fewer replicas than
        `config.replica_num` (too few live segments) is True too: `put_ex` says how many."""
        self._settle()
        return self._writer.put_one(check_key(key), value_view(value), config, upsert=False) > 0

    def put_ex(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> PutResult:
        """`put`, answering a `PutResult`: truthy when stored, with the replicas written and
        asked for (`.degraded` when fewer were written than asked)."""
        self._settle()
        got = self._writer.put_one(check_key(key), value_view(value), config, upsert=False)
        want = 1 if config is None else config.replica_num
        return PutResult(got > 0, got, want)

    @property
    def metrics(self) -> StoreMetrics | None:
        """This Store's counters (`Store(..., metrics=True)`), else None."""
        return self._metrics

    @property
    def put_stats(self) -> PutStats:
        """This Store's put counters (`kvpool.client.result`): keys stored with fewer replicas
        than asked, puts started again after a replica's segment failed, and those that
        failed even so."""
        return self._writer.stats.snapshot()

    def upsert(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> None:
        """Store `value` under `key`, replacing any value it had."""
        self._settle()
        key = check_key(key)
        self._forget([key])
        self._writer.put_one(key, value_view(value), config, upsert=True)

    def put_from(self, key: str, buffer: Buffer, config: ReplicateConfig | None = None) -> bool:
        """`put` of a registered buffer's bytes, zero-copy (the buffer is the whole value)."""
        self._settle()
        key = check_key(key)
        mv = registered_view(self._registry(), buffer, writable=False, what="put_from buffer")
        return self._writer.put_one(key, mv, config, upsert=False) > 0

    def batch_put(
        self, keys: Sequence[str], values: Sequence[Buffer], config: ReplicateConfig | None = None
    ) -> list[ErrorCode]:
        """Put every (key, value); per key: OK (stored), OBJECT_ALREADY_EXISTS (kept the old
        value) or why it failed. Partial success is possible; failed keys leave no trace."""
        self._settle()
        ks = check_keys(keys, unique=True)
        views = batch_views(ks, values, value_view)
        return self._writer.put_batch(ks, views, config, upsert=False)

    def batch_upsert(
        self, keys: Sequence[str], values: Sequence[Buffer], config: ReplicateConfig | None = None
    ) -> list[ErrorCode]:
        """Upsert every (key, value); per key OK or why it failed."""
        self._settle()
        ks = check_keys(keys, unique=True)
        views = batch_views(ks, values, value_view)
        self._forget(ks)
        return self._writer.put_batch(ks, views, config, upsert=True)

    def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[Buffer], config: ReplicateConfig | None = None
    ) -> list[ErrorCode]:
        """`batch_put` from registered buffers, zero-copy."""
        self._settle()
        ks = check_keys(keys, unique=True)
        views = self._registered(check_values(ks, buffers), writable=False, what="put_from buffer")
        return self._writer.put_batch(ks, views, config, upsert=False)

    # ------------------------------------------------------------------ get (reader.py)

    def get(self, key: str) -> bytearray:
        """The value of `key`, read into a buffer allocated once for it (a bytearray, which
        compares equal to the bytes that were put). Raises `ObjectNotFound`."""
        self._settle()
        return self._reader.get(check_key(key))

    def get_into(self, key: str, buffer: Buffer) -> int:
        """Read `key` into the registered `buffer` (zero-copy); returns the value's size.
        A buffer smaller than the value is INVALID_PARAMS and nothing is read."""
        self._settle()
        key = check_key(key)
        mv = registered_view(self._registry(), buffer, writable=True, what="get_into buffer")
        return self._reader.get_into(key, mv)

    def batch_get(self, keys: Sequence[str]) -> list[bytearray | None]:
        """The values of `keys`, None for each key that does not exist or is still being
        written. Any other per-key failure (transfer, checksum, lease) raises once the whole
        batch is done; `batch_get_ex` answers every key's outcome and never raises for one."""
        self._settle()
        return self._reader.batch_get(check_keys(keys, unique=False))

    def batch_get_ex(self, keys: Sequence[str]) -> list[bytearray | ErrorCode]:
        """Per key its value, or the `ErrorCode` saying why there is none: OBJECT_NOT_FOUND,
        REPLICA_IS_NOT_READY (being written), TRANSFER_FAIL, CHECKSUM_MISMATCH,
        LEASE_EXPIRED, ... Never raises for one key."""
        self._settle()
        codes: list[ErrorCode] = []
        values = self._reader.batch_get(check_keys(keys, unique=False), codes)
        return [v if v is not None else c for v, c in zip(values, codes, strict=True)]

    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Buffer]) -> list[int]:
        """Read each key into its registered buffer; per key the bytes read, or a negative
        `ErrorCode` value (OBJECT_NOT_FOUND, INVALID_PARAMS for a buffer too small, ...),
        as Mooncake's batch_get_into."""
        self._settle()
        ks = check_keys(keys, unique=False)
        self._open()
        if isinstance(buffers, str | bytes) or not isinstance(buffers, Sequence):
            raise InvalidParams("buffers: expected a list of registered buffers")
        if len(buffers) != len(ks):
            raise InvalidParams(f"{len(ks)} keys but {len(buffers)} buffers")
        views = self._registered(buffers, writable=True, what="get_into buffer")
        return self._reader.batch_get_into(ks, views)

    # ------------------------------------------------------------------ queries (control.py)

    def exists(self, key: str) -> bool:
        """Whether `key` has a readable value (grants a read lease, as Mooncake's). In cached
        read mode a place remembered less than `location_ttl` ago answers True at once."""
        self._settle()
        key = check_key(key)
        locations = self._locations
        if locations is not None and locations.lookup(key) is not None:
            self._open()
            return True
        return self._control.exists(key)

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        """`exists` of every key, in one round trip (cached read mode: only for the keys
        without a place remembered less than `location_ttl` ago)."""
        self._settle()
        ks = check_keys(keys, unique=False)
        locations = self._locations
        if locations is None:
            return self._control.batch_exists(ks)
        self._open()
        known = [e is not None for e in locations.lookup_many(ks)]
        rest = [i for i, k in enumerate(known) if not k]
        if rest:
            got = self._control.batch_exists([ks[i] for i in rest])
            for i, present in zip(rest, got, strict=True):
                known[i] = present
        return known

    def get_size(self, key: str) -> int:
        """The size in bytes of `key`'s value; raises `ObjectNotFound`."""
        self._settle()
        return self._control.get_size(check_key(key))

    def remove(self, key: str, force: bool = False) -> None:
        """Remove `key`. Raises `ObjectNotFound`, or `ObjectHasLease` while a reader holds a
        lease on it (unless `force`)."""
        self._settle()
        key = check_key(key)
        self._forget([key])
        self._control.remove(key, force)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[ErrorCode]:
        """Remove every key; per key OK or why not (OBJECT_NOT_FOUND, OBJECT_HAS_LEASE, ...)."""
        self._settle()
        ks = check_keys(keys, unique=False)
        self._forget(ks)
        return self._control.batch_remove(ks, force)

    def remove_all(self, force: bool = False) -> int:
        """Remove every object of this tenant (leased ones only with `force`); returns how
        many were removed."""
        self._settle()
        self._clear()
        return self._control.remove_all(force)

    def _forget(self, keys: list[str]) -> None:
        """Cached read mode: this Store's own removals and overwrites are seen at once (and
        the invalidation stream's keys)."""
        if self._locations is not None:
            self._locations.forget_many(keys)
        if self._hot is not None:
            self._hot.forget_many(keys)

    def _clear(self) -> None:
        """Cached read mode: forget every remembered place and hot value."""
        if self._locations is not None:
            self._locations.clear()
        if self._hot is not None:
            self._hot.clear()

    @property
    def hot_cache(self) -> HotCache | None:
        """The hot cache (`hot_cache_size`; its `hits`, `misses`, `hit_ratio`), or None."""
        return self._hot

    def remove_by_regex(self, pattern: str, force: bool = False) -> int:
        """Remove the keys in which `pattern` is found (the syntax of the `regex` package, which
        the master matches with: Python's `re` and more, such as `\\p{L}`); returns the count."""
        self._settle()
        self._clear()
        return self._control.remove_by_regex(check_pattern(pattern), force)

    # ------------------------------------------------------------------ replica tasks (control.py)

    def create_copy_task(self, key: str, targets: Sequence[str]) -> str:
        """Ask the master to copy `key`'s bytes to one new replica on each of `targets`
        (segment names); returns the task id. The copy runs on the node that owns the
        source replica; follow it with `query_task`. Raises the master's refusal
        (ObjectNotFound, NoSpace, OBJECT_HAS_REPLICATION_TASK, ...)."""
        return self._control.create_copy_task(key, targets)

    def create_move_task(self, key: str, source: str, target: str) -> str:
        """Ask the master to move `key`'s replica on segment `source` to segment `target`;
        returns the task id. The source stays readable until the task succeeds."""
        return self._control.create_move_task(key, source, target)

    def query_task(self, task_id: str) -> TaskInfo:
        """The state of a task (TASK_NOT_FOUND once the master has forgotten it)."""
        return self._control.query_task(task_id)

    def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        """Drop the replicas of this client's own objects among `keys` whose lease has
        expired (all of them, or only those on `segment_name`); returns the keys cleared."""
        return self._control.batch_replica_clear(keys, segment_name)

    def get_replica_desc(self, key: str) -> list[ReplicaDesc]:
        """The replicas of `key` (segment, offset, size, status, endpoint, ...); empty when the
        key does not exist or is still being written. Grants a read lease, like a get."""
        return self._control.get_replica_desc(key)

    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDesc]]:
        """`get_replica_desc` of every key, in one round trip."""
        return self._control.batch_get_replica_desc(keys)
