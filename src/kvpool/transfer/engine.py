"""`TransferEngine`: moves bytes between a caller's buffers and any segment of the pool.

Strategy per request, decided once per segment and cached as a route:

* LOCAL: the segment was attached with `attach_local` (it lives in this process): one memcpy.
* SHM: the owner runs on this host (`host_id` equal, which compares boot id, host name and pid
  name space, not an IP: two processes on one host share an IP but not an address space) and
  its `shm_path` opens and verifies: the engine maps the owner's memfd and copies with memcpy.
* TCP: otherwise (or always with `protocol="tcp"`): the owner's `TransferServer`.

Copies of at most `inline_copy_bytes` run in the calling thread: a hand-off to another thread
means waking a thread on another core, which costs far more than copying a few KiB
(docs/performance.md, "Inline cut-over"). `transfer()` (blocking) runs every copy inline;
`submit()` hands larger copies to the memcpy pool (one thread: copies are bounded by memory
bandwidth) so the caller may overlap work.

Routes are cached per segment name. `forget(name)` drops one (closing a peer mapping, or
quarantining it while a transfer holds it); the engine forgets by itself when a peer's owner
process is gone or no longer serves that memory at its shm_path (closed, or remounted: one stat()
of the /proc link, at most every `liveness_interval` s) or its TCP peer fails, so the next
request resolves the segment again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, SegmentError, TransferError
from kvpool.transfer.base import MemoryRegion, Transport
from kvpool.transfer.copy import copy_bytes
from kvpool.transfer.future import TransferFuture
from kvpool.transfer.hostid import host_id as this_host_id
from kvpool.transfer.location import SegmentLocation, normalize_segment_name, parse_endpoint
from kvpool.transfer.memory import (
    PeerMapping,
    SegmentMemory,
    SharedMapping,
    open_peer_mapping,
    retry_quarantined,
)
from kvpool.transfer.proof import KeySource
from kvpool.transfer.registration import MemoryRegistry, byte_view, view_at
from kvpool.transfer.request import TransferOp, TransferRequest
from kvpool.transfer.shm import ShmTransport
from kvpool.transfer.tcp import Piece, TcpTransport

__all__ = ["DEFAULT_STALL_TIMEOUT_S", "Resolver", "RouteKind", "SegmentHold", "TransferEngine"]

log = logging.getLogger(__name__)

Resolver = Callable[[str], SegmentLocation]
_Prepared = tuple[TransferOp, memoryview, str, int, int]
"""A validated request: op, the caller's bytes (exact length), segment name, offset, length."""
ProtocolName = Literal["auto", "shm", "tcp"]

#: Seconds a TCP transfer may go without moving a byte before it fails (a frozen peer).
DEFAULT_STALL_TIMEOUT_S: Final = 5.0
_READ: Final = TransferOp.READ
_WRITE: Final = TransferOp.WRITE


def _as_op(i: int, value: object) -> TransferOp:
    if isinstance(value, TransferOp):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value in (1, 2):
        return TransferOp(value)
    raise InvalidParams(f"request {i}: op {value!r} is not READ or WRITE")


def default_tcp_streams() -> int:
    """Connections per peer for striping a large batch: half the cores, 1 to 4.

    Over loopback each stream keeps a sender and a receiver core busy copying, so striping pays
    only with cores (and NIC queues) to spare (docs/performance.md, "Striping").
    """
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class RouteKind(Enum):
    """How requests for one segment travel."""

    LOCAL = "local"
    SHM = "shm"
    TCP = "tcp"


@dataclass(slots=True)
class _Route:
    kind: RouteKind
    size: int
    mapping: SharedMapping | None
    peer: PeerMapping | None
    endpoint: str
    checked_at: float
    wire_name: bytes = b""


class SegmentHold:
    """A held mapping of a segment (local or same-host): `.buffer` stays valid until
    `release()`, even if the owner unmounts meanwhile (the mapping is quarantined)."""

    __slots__ = ("_mapping", "_view", "name", "route")

    def __init__(self, name: str, route: RouteKind, mapping: SharedMapping) -> None:
        self.name = name
        self.route = route
        self._mapping = mapping
        self._view: memoryview | None = mapping.view

    @property
    def buffer(self) -> memoryview:
        if self._view is None:
            raise TransferError(f"hold on segment {self.name} was released")
        return self._view

    @property
    def address(self) -> int:
        """The address of `.buffer`'s first byte in this process."""
        return self._mapping.address

    def release(self) -> None:
        """Idempotent; do not keep slices of `.buffer` past this."""
        if self._view is not None:
            self._view = None
            self._mapping.release()

    def __enter__(self) -> SegmentHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _copy_held(op: TransferOp, view: memoryview, mapping: SharedMapping, offset: int) -> None:
    """Copy `view` to or from `offset` of a mapping the caller has acquired, then release it.

    The slice goes before the hold: if the mapping was closed meanwhile, the last release
    unmaps it, which a live slice would make fail (quarantined)."""
    seg: memoryview | None = None
    try:
        seg = mapping.view[offset : offset + view.nbytes]
        if op is _READ:
            copy_bytes(view, seg, 0, mapping.address + offset)
        else:
            copy_bytes(seg, view, mapping.address + offset, 0)
    finally:
        if seg is not None:
            seg.release()
        mapping.release()


class TransferEngine:
    """The data plane of one process: see the module docstring."""

    def __init__(
        self,
        resolver: Resolver,
        protocol: ProtocolName = "auto",
        *,
        timeout: float = 60.0,
        stall_timeout: float = DEFAULT_STALL_TIMEOUT_S,
        abort_grace: float = 1.0,
        inline_copy_bytes: int = 2 << 20,
        memcpy_threads: int = 1,
        tcp_streams: int | None = None,
        stripe_bytes: int = 4 << 20,
        chunk_bytes: int = 4 << 20,
        liveness_interval: float = 0.1,
        reap_interval: float = 1.0,
        extra_transports: Sequence[Transport] = (),
        data_key: KeySource | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if protocol not in ("auto", "shm", "tcp"):
            raise InvalidParams(f"protocol must be 'auto', 'shm' or 'tcp', got {protocol!r}")
        if not callable(resolver):
            raise InvalidParams("resolver must be callable: name -> SegmentLocation")
        if timeout <= 0 or abort_grace < 0:
            raise InvalidParams(f"timeout {timeout} must be > 0, abort_grace {abort_grace} >= 0")
        if not stall_timeout > 0:
            raise InvalidParams(f"stall_timeout {stall_timeout} must be > 0")
        if memcpy_threads < 1:
            raise InvalidParams(f"memcpy_threads must be >= 1, got {memcpy_threads}")
        retry_quarantined()
        self.protocol: ProtocolName = protocol
        self.host_id = this_host_id()
        self.timeout = timeout
        self.abort_grace = abort_grace
        self.inline_copy_bytes = inline_copy_bytes
        self.liveness_interval = liveness_interval
        self._resolver = resolver
        self._shm = ShmTransport()
        self._tcp = TcpTransport(
            streams=tcp_streams if tcp_streams is not None else default_tcp_streams(),
            stripe_bytes=stripe_bytes,
            chunk_bytes=chunk_bytes,
            # Progress-based: a socket call waits at most this long for a byte, so a frozen
            # peer fails a request in seconds; `timeout` still bounds each request as a whole.
            io_timeout=min(stall_timeout, timeout),
            on_peer_failure=self._forget_endpoint,
            data_key=data_key,
            tls=tls,
        )
        self._transports: list[Transport] = [self._shm, self._tcp, *extra_transports]
        self.registry = MemoryRegistry(self._transports)
        self._memcpy_pool = ThreadPoolExecutor(memcpy_threads, thread_name_prefix="kvpool-memcpy")
        self._lock = threading.Lock()
        self._local: dict[str, tuple[SegmentMemory, int]] = {}
        self._routes: dict[str, _Route] = {}
        self._closed = False
        # Unmaps peers' segments whose owner is gone even when nothing touches them any more,
        # so a dead node's memory is freed within `reap_interval` s, not when this engine ends.
        self.reap_interval = reap_interval
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    # ---- memory registration -------------------------------------------------------------

    def register(self, buffer: object, length: int | None = None) -> MemoryRegion:
        """Register a buffer, or a raw address (e.g. `tensor.data_ptr()`) with `length`."""
        self._check_open()
        return self.registry.register(buffer, length)

    def register_many(self, items: Sequence[tuple[object, int | None]]) -> list[MemoryRegion]:
        """Register several (buffer or address, length) all-or-nothing."""
        self._check_open()
        return self.registry.register_many(items)

    def unregister(self, buffer: object) -> None:
        """Deregister (best effort on every transport; raises the first error)."""
        self.registry.unregister(buffer)

    # ---- segments ------------------------------------------------------------------------

    def attach_local(self, mem: SegmentMemory) -> None:
        """Serve requests for `mem` (a segment of this process) with a direct memcpy."""
        self._check_open()
        with self._lock:
            if mem.name in self._local:
                raise SegmentError(
                    f"segment {mem.name} is already attached", ErrorCode.SEGMENT_ALREADY_EXISTS
                )
            token = mem.add_close_hook(self._on_local_close)
            self._local[mem.name] = (mem, token)
            self._routes.pop(mem.name, None)

    def detach_local(self, name: str) -> None:
        """Stop using local segment `name`; SEGMENT_NOT_FOUND when it is not attached."""
        name = normalize_segment_name(name)
        with self._lock:
            entry = self._local.pop(name, None)
            self._routes.pop(name, None)
        if entry is None:
            raise SegmentError(f"segment {name} is not attached")
        entry[0].remove_close_hook(entry[1])

    def _on_local_close(self, mem: SegmentMemory) -> None:
        with self._lock:
            entry = self._local.get(mem.name)
            if entry is not None and entry[0] is mem:
                del self._local[mem.name]
                self._routes.pop(mem.name, None)

    def open_segment(self, name: str) -> SegmentLocation:
        """Resolve segment `name` (a leading '/' is stripped) and cache how to reach it.

        Returns its location (for a local segment, one built from the segment itself).
        """
        self._check_open()
        clean = normalize_segment_name(name)
        route = self._route(clean)
        with self._lock:
            local = self._local.get(clean)
        if local is not None and route.kind is RouteKind.LOCAL:
            mem = local[0]
            return SegmentLocation(mem.name, mem.size, self.host_id, "", mem.shm_path)
        if route.peer is not None:
            return route.peer.location
        return self._resolve(clean)

    def hold_segment(self, name: str) -> SegmentHold:
        """Map (or reuse the mapping of) a local or same-host segment and hold it."""
        self._check_open()
        clean = normalize_segment_name(name)
        route = self._route(clean)
        if route.mapping is None:
            raise TransferError(f"segment {clean} is not reachable through shared memory")
        if not route.mapping.acquire():
            self.forget(clean)
            raise TransferError(f"segment {clean} is closing")
        return SegmentHold(clean, route.kind, route.mapping)

    def held_mapping(self, name: str) -> SharedMapping | None:
        """The mapping of segment `name`, acquired (the caller releases it), when its route is
        already known, mapped here (LOCAL or SHM) and due no owner liveness check; None
        otherwise, and then the caller takes `hold_segment`'s path, which resolves, checks the
        owner and raises as it does. The small strict read's one call (`DataPath.read_mapped`)."""
        route = self._routes.get(name)
        if route is None or route.mapping is None:
            return None
        if route.peer is not None and time.monotonic() - route.checked_at > self.liveness_interval:
            return None
        mapping = route.mapping
        return mapping if mapping.acquire() else None

    def forget(self, name: str) -> None:
        """Drop what is cached about segment `name` (its location, its peer mapping)."""
        clean = normalize_segment_name(name)
        with self._lock:
            route = self._routes.pop(clean, None)
        if route is not None and route.peer is not None:
            route.peer.mapping.close()  # quarantined while a transfer holds it
        if route is not None and route.kind is RouteKind.TCP:
            self._tcp.drop_peer(route.endpoint)

    def route_kind(self, name: str) -> RouteKind:
        """How requests for `name` travel (resolving it if needed)."""
        return self._route(normalize_segment_name(name)).kind

    def _forget_endpoint(self, endpoint: str) -> None:
        with self._lock:
            names = [n for n, r in self._routes.items() if r.endpoint == endpoint]
            for n in names:
                del self._routes[n]
        log.info("peer %s failed; forgot segments %s", endpoint, names)

    def _resolve(self, name: str) -> SegmentLocation:
        try:
            loc = self._resolver(name)
        except KVPoolError:
            raise
        except Exception as exc:
            raise SegmentError(f"resolving segment {name} failed: {exc!r}") from exc
        if not isinstance(loc, SegmentLocation):
            raise InvalidParams(f"resolver returned {type(loc).__name__} for {name}")
        return loc

    def _route(self, name: str) -> _Route:
        route = self._routes.get(name)
        if route is not None:
            if route.peer is not None:
                now = time.monotonic()
                if now - route.checked_at > self.liveness_interval:
                    if not route.peer.owner_alive():
                        self.forget(name)
                        raise TransferError(f"the owner of segment {name} is gone or remounted it")
                    route.checked_at = now
            return route
        route = self._new_route(name)
        with self._lock:
            existing = self._routes.get(name)
            if existing is None:
                self._routes[name] = route
                return route
        if route.peer is not None:  # another thread won the race: keep its mapping
            route.peer.mapping.close()
        return existing

    def _new_route(self, name: str) -> _Route:
        now = time.monotonic()
        if self.protocol != "tcp":
            with self._lock:
                local = self._local.get(name)
            if local is not None:
                mem = local[0]
                return _Route(RouteKind.LOCAL, mem.size, mem.mapping, None, "", now)
        loc = self._resolve(name)
        if loc.name != name:
            raise SegmentError(f"resolver returned segment {loc.name!r} for {name!r}")
        if self.protocol != "tcp" and loc.host_id == self.host_id and loc.shm_path:
            try:
                peer = open_peer_mapping(loc)
                self._start_reaper()
                return _Route(RouteKind.SHM, loc.size, peer.mapping, peer, loc.endpoint, now)
            except KVPoolError as exc:
                if self.protocol == "shm" or not loc.endpoint:
                    raise TransferError(f"segment {name}: shared memory failed: {exc}") from exc
                log.info("segment %s: shared memory failed (%s); using TCP", name, exc)
        elif self.protocol == "shm":
            raise TransferError(
                f"segment {name} is on host {loc.host_id}, not reachable by shared memory"
            )
        if not loc.endpoint:
            raise TransferError(f"segment {name} has no transfer endpoint")
        parse_endpoint(loc.endpoint)
        return _Route(RouteKind.TCP, loc.size, None, None, loc.endpoint, now, name.encode())

    # ---- transfers -----------------------------------------------------------------------

    def submit(
        self, requests: Sequence[TransferRequest], timeout: float | None = None
    ) -> TransferFuture:
        """Start a batch; returns its future. Malformed requests raise `InvalidParams` before
        anything moves; everything else (unknown segment, out of bounds, peer failure) is that
        request's status."""
        return self._submit(requests, timeout, inline=False)

    def transfer(
        self,
        requests: Sequence[TransferRequest],
        timeout: float | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        """Run a batch in the calling thread where possible and wait for it; raises
        `TransferError` (with the failing code) naming the first failed request.

        `meanwhile`: called while one WRITE over TCP waits for the server's answer (see
        `TcpTransport.exchange_one`); not called on any other path."""
        self._check_open()
        prepared = [self._prepare(i, r) for i, r in enumerate(requests)]
        if len(prepared) == 1 and self._tcp_one(prepared[0], timeout, meanwhile):
            return
        if not self._copy_all_inline(prepared):
            future = self._start(prepared, timeout, inline=True)
            future.wait(self.timeout if timeout is None else timeout)
            future.raise_for_status()

    def transfer_batch(
        self, requests: Sequence[TransferRequest], timeout: float | None = None
    ) -> list[ErrorCode]:
        """Like `transfer` (the calling thread does the copies and runs one TCP lane per peer,
        no hand-off to the pools for small batches) but returns every request's code instead
        of raising; for a client that handles failures per key (a batch get)."""
        self._check_open()
        prepared = [self._prepare(i, r) for i, r in enumerate(requests)]
        future = self._start(prepared, timeout, inline=True)
        return future.result(self.timeout if timeout is None else timeout)

    def _tcp_one(
        self, req: _Prepared, timeout: float | None, meanwhile: Callable[[], None] | None = None
    ) -> bool:
        """The fast path of `transfer` for one small request over TCP (a cross-host KV get):
        one exchange on a pooled connection, no future, no lanes. False (nothing done) when
        the request does not qualify; raises `TransferError` when it fails."""
        op, view, name, offset, n = req
        route = self._routes.get(name)
        if route is None or route.kind is not RouteKind.TCP or n >= self._tcp.stripe_bytes:
            return False
        if offset + n > route.size:
            return False  # the general path reports it
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        code, why = self._tcp.exchange_one(
            route.endpoint,
            Piece(0, int(op), view, route.wire_name, offset, n),
            deadline,
            meanwhile,
        )
        if code is not ErrorCode.OK:
            raise TransferError(f"request 0 ({op.name} {name}@{offset}+{n}) failed: {why}", code)
        return True

    def _copy_all_inline(self, prepared: list[_Prepared]) -> bool:
        """The fast path of `transfer` (a same-host KV get is one 4 KiB copy): when every
        request has a cached memory route, copy them here without a future; False (nothing
        done) otherwise."""
        mappings: list[SharedMapping] = []
        now = time.monotonic()
        for _op, _view, name, offset, n in prepared:
            route = self._routes.get(name)
            if route is None or route.mapping is None:
                return False
            if route.peer is not None and now - route.checked_at > self.liveness_interval:
                return False  # the owner's liveness is due for a check: general path
            if offset + n > route.size:
                return False
            mappings.append(route.mapping)
        for i, (op, view, name, offset, n) in enumerate(prepared):
            mapping = mappings[i]
            if not mapping.acquire():
                self.forget(name)
                raise TransferError(
                    f"request {i} ({op.name} {name}@{offset}+{n}) failed: segment is closing",
                    ErrorCode.SEGMENT_NOT_FOUND,
                )
            _copy_held(op, view, mapping, offset)
        return True

    def _submit(
        self, requests: Sequence[TransferRequest], timeout: float | None, inline: bool
    ) -> TransferFuture:
        self._check_open()
        prepared = [self._prepare(i, r) for i, r in enumerate(requests)]
        return self._start(prepared, timeout, inline)

    def _start(
        self, prepared: list[_Prepared], timeout: float | None, inline: bool
    ) -> TransferFuture:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)

        def describe(i: int) -> str:
            op, _, name, offset, n = prepared[i]
            return f"{op.name} {name}@{offset}+{n}"

        future = TransferFuture(len(prepared), self.abort_grace, describe)
        tcp_groups: dict[str, list[Piece]] = {}
        copies: list[tuple[int, TransferOp, memoryview, SharedMapping, int]] = []
        for i, (op, view, name, offset, n) in enumerate(prepared):
            try:
                route = self._route(name)
            except KVPoolError as exc:
                future.complete(i, exc.code, exc.message)
                continue
            if offset + n > route.size:
                future.complete(
                    i,
                    ErrorCode.INVALID_PARAMS,
                    f"{offset}+{n} is beyond segment {name} of {route.size} bytes",
                )
                continue
            mapping = route.mapping
            if mapping is None:
                piece = Piece(i, int(op), view, route.wire_name, offset, n)
                tcp_groups.setdefault(route.endpoint, []).append(piece)
            elif not mapping.acquire():
                self.forget(name)
                future.complete(i, ErrorCode.SEGMENT_NOT_FOUND, f"segment {name} is closing")
            elif inline or n <= self.inline_copy_bytes:
                copies.append((i, op, view, mapping, offset))
            else:
                try:
                    self._memcpy_pool.submit(
                        self._copy_task, future, i, (op, view, mapping, offset)
                    )
                except RuntimeError:
                    mapping.release()
                    future.complete(i, ErrorCode.TRANSFER_FAIL, "transfer engine is closed")
        # Network first, so remote peers work while this thread copies; in blocking mode the
        # calling thread then runs the last peer's first lane itself.
        groups = list(tcp_groups.items())
        for endpoint, pieces in groups[:-1]:
            self._tcp.run(endpoint, pieces, future, deadline, False)
        for i, op, view, mapping, offset in copies:
            code, why = ErrorCode.OK, ""
            try:
                _copy_held(op, view, mapping, offset)
            except (ValueError, TypeError, KVPoolError) as exc:
                code, why = ErrorCode.TRANSFER_FAIL, f"copy failed: {exc!r}"
            future.complete(i, code, why)
        if groups:
            endpoint, pieces = groups[-1]
            self._tcp.run(endpoint, pieces, future, deadline, inline)
        return future

    def _prepare(self, i: int, req: object) -> _Prepared:
        if not isinstance(req, TransferRequest):
            raise InvalidParams(f"request {i}: expected TransferRequest, got {type(req).__name__}")
        op = _as_op(i, req.op)
        offset, length = req.offset, req.length
        if type(offset) is not int or offset < 0:
            raise InvalidParams(f"request {i}: offset {offset!r} must be an int >= 0")
        if length is not None and type(length) is not int:
            raise InvalidParams(f"request {i}: length {length!r} must be an int")
        buf = req.buffer
        if type(buf) is int:
            if length is None or length <= 0:
                raise InvalidParams(f"request {i}: an address needs a length > 0")
            if self.registry.find(buf, length) is None:
                raise InvalidParams(
                    f"request {i}: {buf:#x}+{length} is not inside registered memory"
                )
            view = view_at(buf, length)
        elif type(buf) is bytearray:  # the common case, already flat bytes
            view = memoryview(buf)
        else:
            view = byte_view(buf, writable=op is _READ, what=f"request {i} buffer")
        n = view.nbytes if length is None else length
        if n <= 0 or n > view.nbytes:
            raise InvalidParams(f"request {i}: length {n} outside 1..{view.nbytes}")
        if n != view.nbytes:
            view = view[:n]
        name = req.segment
        if (
            type(name) is not str or name not in self._routes
        ):  # a cached route's name was validated when resolved
            name = normalize_segment_name(name)
        return op, view, name, offset, n

    def _copy_task(
        self,
        future: TransferFuture,
        i: int,
        job: tuple[TransferOp, memoryview, SharedMapping, int],
    ) -> None:
        op, view, mapping, offset = job
        n = view.nbytes
        user: npt.NDArray[np.uint8] | None = None
        seg: npt.NDArray[np.uint8] | None = None
        try:
            if future.aborted:
                future.complete(i, ErrorCode.TRANSFER_FAIL, "aborted")
                return
            user = np.frombuffer(view, dtype=np.uint8)
            seg = np.frombuffer(mapping.view, dtype=np.uint8, count=n, offset=offset)
            # numpy releases the GIL while it copies, so other threads keep running.
            if op is _READ:
                np.copyto(user, seg)
            else:
                np.copyto(seg, user)
            future.complete(i, ErrorCode.OK)
        except Exception as exc:
            future.complete(i, ErrorCode.TRANSFER_FAIL, f"copy failed: {exc!r}")
        finally:
            # The arrays export the mapping's memory: drop them before the hold (see
            # _copy_all_inline), also when the copy failed.
            user = seg = None
            mapping.release()

    # ---- lifecycle -----------------------------------------------------------------------

    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is not None or self._closed:
                return
            self._reaper = threading.Thread(
                target=self._reap_loop, name="kvpool-transfer-reaper", daemon=True
            )
            self._reaper.start()

    def _reap_loop(self) -> None:
        while not self._stop.wait(self.reap_interval):
            with self._lock:
                peers = [(n, r.peer) for n, r in self._routes.items() if r.peer is not None]
            for name, peer in peers:
                if not peer.owner_alive():
                    log.info("segment %s: its owner is gone; unmapping it", name)
                    with self._lock:
                        route = self._routes.get(name)
                        if route is not None and route.peer is peer:
                            del self._routes[name]
                        else:
                            continue
                    peer.mapping.close()  # quarantined while a transfer holds it
            retry_quarantined()

    def _check_open(self) -> None:
        if self._closed:
            raise TransferError(
                "transfer engine is closed", ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
            )

    def close(self) -> None:
        """Stop every pool and connection, unmap peer segments (quarantined while held),
        detach local segments. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            routes = list(self._routes.values())
            self._routes.clear()
            local = list(self._local.values())
            self._local.clear()
        for mem, token in local:
            mem.remove_close_hook(token)
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
        # Queued copies still run (they hold their mappings and complete their futures).
        self._memcpy_pool.shutdown(wait=True)
        for t in self._transports:
            with contextlib.suppress(Exception):
                t.close()
        for r in routes:
            if r.peer is not None:
                r.peer.mapping.close()
        retry_quarantined()

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
