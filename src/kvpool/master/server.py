"""`MasterServer`: the master service behind an `RpcServer`, plus its background tasks.

Everything runs on the one event loop that called `start()`: requests are served inline by
`MasterService` (a dict lookup on the request's type, then the handler), and four background
tasks take turns with them:

* the **monitor**, every `monitor_interval` (1 s): freezes what the garbage collector has
  seen so far (`gc.freeze()`: the metadata is acyclic, so collections need only look at what
  is new), expires clients silent for `client_ttl` (not for a stall of the loop itself:
  `check_liveness` pushes every deadline past a stall of its runs well beyond the period),
  releases stale PutStarts and parked replicas, and, when a segment went away, sweeps the
  replicas of dead segments out of the metadata `sweep_batch` objects per loop turn;
* the **reclaim tick**, every `reclaim_interval`: `hooks.tick(now)` (kswapd's chance to act);
* the **repair tick**, every `repair_interval`: starts copies of objects that lost replicas
  (`repair.py`), a bounded number per tick;
* RemoveAll / RemoveByRegex run as tasks that give the loop a turn every few thousand objects,
  so a million-object removal never stalls the requests behind it; a batch request of more than
  `batch_chunk_keys` keys is served the same way, as sub-batches.

`close()` stops the tasks, then the RPC server (which closes every connection); it is
idempotent, and `kvpool master` calls it on SIGINT / SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec

from kvpool.errors import ErrorCode, KVPoolError
from kvpool.fdlimit import raise_fd_limit
from kvpool.master.auth import Credentials, RequestPolicy
from kvpool.master.config import MasterConfig
from kvpool.master.guard import SegmentGuard
from kvpool.master.hooks import ReclaimHooks
from kvpool.master.invalidation import InvalidationHub
from kvpool.master.quota import TenantQuotas
from kvpool.master.service import MasterService
from kvpool.protocol.invalidation import Subscribe
from kvpool.protocol.messages import (
    Barrier,
    BatchExistKey,
    BatchGetLocations,
    BatchGetReplicaList,
    BatchPutCommit,
    BatchPutEnd,
    BatchPutRevoke,
    BatchPutStart,
    BatchRemove,
    BatchReply,
    BatchUpsertStart,
    FetchSnapshot,
    FollowLog,
    HaStatus,
    HaStatusReply,
    LocationsReply,
    Message,
    RemoveAll,
    RemoveByRegex,
    Reply,
    Request,
    SegmentName,
)
from kvpool.rpc.server import Connection, RpcServer
from kvpool.rpc.tls import TlsConfig

__all__ = ["MasterServer"]

log = logging.getLogger(__name__)


class MasterServer:
    """One master: service, RPC server and background tasks (owned, closed by `close()`)."""

    def __init__(
        self,
        config: MasterConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        hooks: ReclaimHooks | None = None,
        server_name: str = "kvpool-master",
        open_data_dir: bool = True,
        term: Callable[[], int] | None = None,
    ) -> None:
        self.config = config if config is not None else MasterConfig()
        self._clock = clock
        self.service = MasterService(
            self.config, clock=clock, hooks=hooks, open_data_dir=open_data_dir
        )
        self._handlers: dict[type[Any], Callable[[Any], Any]] = {}
        #: The tenant quotas (None: no --tenant-quota-file), applied to each service installed.
        self.quotas = (
            TenantQuotas(self.config.tenant_quota_file) if self.config.tenant_quota_file else None
        )
        self._install(self.service)
        durable = self.service.durable
        #: The auth file's tokens (None: no credentials; every request is served as before).
        self.credentials = Credentials(self.config.auth_file) if self.config.auth_file else None
        #: TLS of the TCP listener (None: plain; `kvpool.rpc.tls`).
        self.tls = (
            TlsConfig(self.config.tls_cert, self.config.tls_key, self.config.tls_ca)
            if self.config.tls_cert
            else None
        )
        #: Segment ownership checks made with or without credentials (`kvpool.master.guard`).
        self.guard = SegmentGuard(lambda: self.service.segments)
        #: The invalidation stream of cached-mode clients (`kvpool.master.invalidation`).
        self.invalidations = InvalidationHub()
        handler = self._front_handler(lambda: self.service._core)
        if self.credentials is not None:
            handler = RequestPolicy().gate(handler)
        self.rpc = RpcServer(
            handler,
            request_type=Request | Subscribe,
            host=self.config.host,
            port=self.config.port,
            cluster_id=self.config.cluster_id,
            server_name=server_name,
            unix=self.config.unix_socket,
            handshake_timeout=self.config.rpc_handshake_timeout,
            idle_timeout=self.config.rpc_idle_timeout,
            max_connections=self.config.rpc_max_connections,
            max_connections_per_peer=self.config.rpc_max_connections_per_peer,
            busy_poll=self.config.rpc_busy_poll,
            term=term,
            tokens=None if self.credentials is None else self.credentials.tokens,
            tls=self.tls.server_context() if self.tls is not None else None,
        )
        del durable
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    def _install(self, service: MasterService) -> None:
        """Serve `service` from now on (an HA master replaces a stale one)."""
        old = getattr(self, "service", None)
        if old is not None and old is not service and old.tiers.dfs is not None:
            old.tiers.dfs.close()  # the replaced service's open directory iterator
        self.service = service
        service.set_quotas(self.quotas)
        if service.tiers.dfs is not None:  # tiers: only a leader removes orphan DFS files
            service.tiers.dfs.leading = getattr(self, "_leading", None)
        handlers: dict[type[Any], Callable[[Any], Any]] = dict(service.handlers)
        handlers[RemoveAll] = self._remove_all
        handlers[RemoveByRegex] = self._remove_by_regex
        for batch_type in _BATCH_TYPES:
            handlers[batch_type] = self._batch_handler(handlers[batch_type])
        handlers[HaStatus] = self._ha_status
        handlers[Barrier] = _barrier
        handlers[FollowLog] = handlers[FetchSnapshot] = self._not_ha
        self._handlers.clear()
        self._handlers.update(handlers)

    def _front_handler(self, core: Callable[[], Any]) -> Callable[[Any, Connection], Any]:
        """What serves a request (behind the auth gate): the guard's checks of the segment
        requests (`kvpool.master.guard`), Subscribe served by the invalidation hub, the rest by
        its handler. With the plain `_handle` (no durable log, no HA) one closure does all
        three, a Python call per request instead of three; otherwise the wrappers chain."""
        leading = getattr(self, "_leading", None)
        if leading is not None or self.service.durable is not None:
            inner = self.guard.guard(self._rpc_handler())
            return self.invalidations.wrap(inner, core, leading)
        handlers = self._handlers
        special = SegmentGuard.WATCHED | {Subscribe}
        check = self.guard.check
        hub = self.invalidations

        def handle(request: Any, conn: Connection) -> Any:
            t = type(request)
            if t in special:
                if t is Subscribe:  # InvalidationHub.wrap's case
                    hub.attach(core())
                    return hub.subscribe(request, conn)
                refusal = check(request, conn)  # SegmentGuard.guard's case
                if refusal is not None:
                    return refusal
            return handlers[t](request)

        return handle

    def _rpc_handler(self) -> Callable[[Any, Connection], Any]:
        durable = self.service.durable
        return self._handle if durable is None else self._durable_handler(durable.log.flush)

    def _ha_status(self, req: HaStatus) -> HaStatusReply:
        return HaStatusReply(0, "single", objects=len(self.service.index))

    def _not_ha(self, req: Any) -> Message:
        raise KVPoolError("this master runs without --ha", ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)

    def ha_status(self) -> HaStatusReply:
        """This master's role in its HA group ("single" without --ha)."""
        return self._ha_status(HaStatus())

    def wrap_handler(
        self,
        wrap: Callable[[Callable[[Any, Connection], Any]], Callable[[Any, Connection], Any]],
    ) -> None:
        """Serve every request through `wrap(handler)` from now on (the request counters of
        `kvpool.ops.metrics`, installed only when the master serves HTTP). The RPC server
        looks its handler up per request, so this takes effect at once."""
        self.rpc._handler = wrap(self.rpc._handler)

    @property
    def address(self) -> tuple[str, int]:
        return self.rpc.address

    @property
    def endpoint(self) -> str:
        return self.rpc.endpoint

    async def start(self) -> None:
        """Bind (an `OSError` when the address is taken) and start the background tasks.

        Raises the process's file-descriptor soft limit to its hard limit first, so the
        connection caps (sized below it) are the limit peers meet, not EMFILE."""
        raise_fd_limit()
        # The collector's youngest generation at 10,000 new objects instead of 700: a put makes
        # a few tracked records that all survive, so at 700 a young collection ran every ~150
        # puts; fewer, larger ones cost less CPU and no worse a tail (measured in
        # docs/parts/perf-master.md, "The collector"; the monitor freezes survivors each second).
        gc.set_threshold(10_000, *gc.get_threshold()[1:])
        await self.rpc.start()
        self._tasks = [
            asyncio.create_task(self._monitor(), name="master-monitor"),
            asyncio.create_task(self._reclaim_ticks(), name="master-reclaim-tick"),
            asyncio.create_task(self._repair_ticks(), name="master-repair-tick"),
            asyncio.create_task(self._drain_ticks(), name="master-drain-tick"),
        ]
        if self.config.data_dir is not None:
            # Without a data directory there is never a log to sync: no task waking a
            # hundred times a second for nothing (docs/parts/perf-master.md).
            self._tasks.append(asyncio.create_task(self._durable_ticks(), name="master-oplog"))

    async def close(self) -> None:
        """Stop the background tasks and the RPC server. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.rpc.close()
        if self.service.durable is not None:
            self.service.durable.close()
        if self.service.tiers.dfs is not None:
            self.service.tiers.dfs.close()

    async def __aenter__(self) -> MasterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ requests

    def _handle(self, request: Any, conn: Connection) -> Any:
        return self._handlers[type(request)](request)

    def _durable_handler(self, flush: Callable[[], None]) -> Callable[[Any, Connection], Any]:
        """`_handle`, then the request's log records written before its reply leaves (after
        each step of a chunked request: every step writes its own records first)."""
        handlers = self._handlers

        def handle(request: Any, conn: Connection) -> Any:
            reply = handlers[type(request)](request)
            flush()
            if inspect.isawaitable(reply):
                return _flushed(reply, flush)
            return reply

        return handle

    def _batch_handler(self, inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """`inner` for batches up to `batch_chunk_keys` keys; a larger batch is served as
        sub-batches of that size with a loop turn between them (each is a complete request of
        its own, so nothing is held across the turn), and the results are joined in order."""
        chunk = self.config.batch_chunk_keys

        def handle(req: Any) -> Any:
            if len(req.keys) <= chunk or not _splittable(req):
                return inner(req)
            return _join(inner, req, chunk)

        return handle

    async def _remove_all(self, req: RemoveAll) -> Message:
        return await _chunked(self.service.remove_matching(req.tenant, None, req.force))

    def _remove_by_regex(self, req: RemoveByRegex) -> Any:
        rx = self.service.compile_pattern(req.pattern)
        if rx is None:
            return self.service.remove_by_regex(req)  # answers INVALID_PARAMS at once
        return _chunked(self.service.remove_matching(req.tenant, rx, req.force))

    # ------------------------------------------------------------------ background

    async def _monitor(self) -> None:
        interval = self.config.monitor_interval
        while True:
            await asyncio.sleep(interval)
            svc = self.service
            # Move everything that survived the last interval out of the collector's sight.
            # The metadata (a million slotted records) holds no reference cycles and is freed
            # by reference counting; without this, each full collection walks all of it (a
            # pause of seconds at a million objects: the master's section of
            # docs/architecture.md has the measurements). The price: cyclic garbage that was
            # still alive a second earlier (rare here: a connection object, a task) is never
            # collected.
            gc.freeze()
            try:
                svc.check_liveness()
                svc.release_stale()
                if svc.sweep_needed:
                    removed = 0
                    for so_far in svc.sweep_dead():
                        removed = so_far
                        await asyncio.sleep(0)  # let requests in between chunks
                    if removed:
                        log.info("swept %d objects left without a live replica", removed)
            except Exception:
                # A bug here must not silently end liveness checking for the master's lifetime.
                log.exception("master monitor step failed")

    async def _reclaim_ticks(self) -> None:
        interval = self.config.reclaim_interval
        while True:
            await asyncio.sleep(interval)
            svc = self.service
            try:
                svc.hooks.tick(svc.now())
            except Exception:
                log.exception("reclaim tick failed")

    async def _repair_ticks(self) -> None:
        interval = self.config.repair_interval
        while True:
            await asyncio.sleep(interval)
            svc = self.service
            try:
                svc.repair_tick()
            except Exception:
                log.exception("repair tick failed")

    async def _drain_ticks(self) -> None:
        """Step the graceful drains of segments (`drain.py`) five times a second, while any
        runs (an idle master only reads a flag)."""
        while True:
            await asyncio.sleep(0.2)
            drains = self.service.drains
            if not drains.active:
                continue
            try:
                drains.tick()
            except Exception:
                log.exception("drain tick failed")

    async def _durable_ticks(self) -> None:
        """Group fsync of the operation log every `fsync_interval`, a snapshot (a forked
        child) every `snapshot_interval`, reaping the child in between."""
        interval = max(self.config.fsync_interval, 0.001)
        next_snapshot = time.monotonic() + self.config.snapshot_interval
        while True:
            await asyncio.sleep(interval)
            durable = self.service.durable
            if durable is None:
                next_snapshot = time.monotonic() + self.config.snapshot_interval
                continue
            try:
                fd = durable.sync_due()
                if fd is not None:  # fdatasync blocks for a disk's latency: not on the loop
                    await asyncio.to_thread(durable.log.fdatasync_fd, fd)
                durable.poll()
                if time.monotonic() >= next_snapshot:
                    next_snapshot = time.monotonic() + self.config.snapshot_interval
                    durable.snapshot()
            except Exception:
                log.exception("operation log tick failed")


def _barrier(req: Barrier) -> Reply:
    """Nothing to apply: an HA leader answers it after its standbys' ack (`master.ha`)."""
    return Reply(0)


async def _flushed(reply: Awaitable[Any], flush: Callable[[], None]) -> Any:
    """`reply`, its log records written first (a chunked request's last step)."""
    try:
        return await reply
    finally:
        flush()


_BATCH_TYPES = (
    BatchPutCommit,
    BatchPutStart,
    BatchUpsertStart,
    BatchPutEnd,
    BatchPutRevoke,
    BatchGetReplicaList,
    BatchGetLocations,
    BatchExistKey,
    BatchRemove,
)


def _splittable(req: Any) -> bool:
    """Whether every per-key list of `req` has one entry per key (a request that does not
    is answered INVALID_PARAMS by the service at once, unsplit)."""
    n = len(req.keys)
    if isinstance(req, BatchPutStart | BatchUpsertStart):
        groups = req.config.group_ids
        return len(req.sizes) == n and (groups is None or len(groups) == n)
    if isinstance(req, BatchPutEnd):
        return not req.checksums or len(req.checksums) == n
    if isinstance(req, BatchPutCommit):
        groups = req.config.group_ids
        return (
            len(req.sizes) == n
            and len(req.offsets) == n
            and (not req.checksums or len(req.checksums) == n)
            and (groups is None or len(groups) == n)
        )
    return True


def _part(req: Any, lo: int, hi: int) -> Any:
    """The sub-request of `req` for keys [lo, hi)."""
    changes: dict[str, Any] = {"keys": req.keys[lo:hi]}
    if isinstance(req, BatchPutStart | BatchUpsertStart):
        changes["sizes"] = req.sizes[lo:hi]
        if req.config.group_ids is not None:
            changes["config"] = msgspec.structs.replace(
                req.config, group_ids=req.config.group_ids[lo:hi]
            )
    elif isinstance(req, BatchPutEnd) and req.checksums:
        changes["checksums"] = req.checksums[lo:hi]
    elif isinstance(req, BatchPutCommit):
        changes["sizes"] = req.sizes[lo:hi]
        changes["offsets"] = req.offsets[lo:hi]
        if req.checksums:
            changes["checksums"] = req.checksums[lo:hi]
        if req.config.group_ids is not None:
            changes["config"] = msgspec.structs.replace(
                req.config, group_ids=req.config.group_ids[lo:hi]
            )
    return msgspec.structs.replace(req, **changes)


async def _join(inner: Callable[[Any], Any], req: Any, chunk: int) -> Message:
    parts: list[Any] = []
    for lo in range(0, len(req.keys), chunk):
        if lo:
            await asyncio.sleep(0)  # let other requests in between sub-batches
        parts.append(inner(_part(req, lo, lo + chunk)))
    first = parts[0]
    if isinstance(first, BatchReply):
        return BatchReply([c for p in parts for c in p.codes])
    if isinstance(first, LocationsReply):
        return _join_locations(parts)
    return type(first)([r for p in parts for r in p.results])  # type: ignore[no-any-return]


def _join_locations(parts: list[LocationsReply]) -> LocationsReply:
    """One LocationsReply from those of sub-batches: each part names its segments by its own
    indexes, so they are renumbered into one table."""
    index: dict[SegmentName, int] = {}
    endpoints: list[str] = []
    out = LocationsReply([], [], [], [], [], [], parts[0].lease_ttl_ms)
    for part in parts:
        remap: list[int] = []
        for name, endpoint in zip(part.segments, part.endpoints, strict=True):
            i = index.get(name)
            if i is None:
                i = index[name] = len(endpoints)
                endpoints.append(endpoint)
            remap.append(i)
        out.codes += part.codes
        out.sizes += part.sizes
        out.checksums += part.checksums
        for p in part.places:
            out.places.append([remap[v] if k % 2 == 0 else v for k, v in enumerate(p)])
        out.lease_ttl_ms = max(out.lease_ttl_ms, part.lease_ttl_ms)
    out.segments = list(index)
    out.endpoints = endpoints
    return out


async def _chunked(steps: Iterator[Message | None]) -> Message:
    """Run a chunked service operation, yielding to the loop between its chunks."""
    for step in steps:
        if step is not None:
            return step
        await asyncio.sleep(0)
    raise AssertionError("a chunked operation ended without a reply")
