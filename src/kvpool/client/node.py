"""The node runtime: this process's membership in a pool, its segments, and its heartbeat.

Every process that talks to a master is a *client* of it, and a client that mounts memory is
also a *node*. `NodeRuntime` owns what that takes, in one place, for both the `Store` (which
may mount a segment with `segment_size > 0`) and the storage-only `kvpool node` command:

* the control-plane connection (`RpcClient`) and this process's `client_id` (uuid4 hex);
* registration: `ReMountSegment(client_id, host_id, segments)`, sent at start (with no segments
  for a pure client), after every mount, and again whenever a Ping answers NEED_REMOUNT (the
  master restarted, dropped us, or holds us as silent after a pause), so the master's view of
  our segments heals itself. Every segment carries the random 64-bit `generation` drawn when
  its memory was made: after a pause the master restores a segment it kept (with its objects)
  only if name and generation match, and says which (`RemountReply.restored`, kept in
  `restored`); the others were mounted fresh;
* the segments (`SegmentMemory`, pre-faulted memfds) and the `TransferServer` that serves them
  to other hosts (started lazily with the first segment, on a port the OS picks, or with
  `transfer_ports` on a free port of that range: `bind_transfer_server`);
* the heartbeat thread (`Heartbeat`): a Ping every `interval` (1 s, injectable for tests; a
  Ping that says replica tasks are pending calls `on_pending_tasks`); after
  `max_failures` (3) failed pings in a row it reconnects (a fresh `RpcClient`: the master may
  have restarted at the same address) and keeps trying with exponential backoff up to
  `max_backoff`; a successful Ping resets it.

With an `etcd://HOST:PORT[,...]/CLUSTER_ID` master (`kvpool.client.leader`) the node follows the
cluster's leader: its `rpc` is a `FailoverRpcClient` that moves to each newer leader the
`LeaderFollower` reports (the etcd watch, or a NOT_LEADER answer), and after `max_failures`
failed pings the heartbeat asks etcd again instead of only reconnecting. After every switch the
heartbeat wakes at once, gives up what the old leader lent (`on_heartbeat(False)`: arenas) and
remounts every segment with its generation (the new leader restores them with their objects),
without waiting for a Ping to say NEED_REMOUNT.

`close()` is idempotent and undoes everything in reverse: stop the heartbeat, unmount every
segment at the master (best effort: a dead master cannot be told, and it will expire us after
`client_ttl` anyway), stop serving, unmap the memory, close the connection.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import random
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kvpool.client.leader import (
    DEFAULT_FAILOVER_TIMEOUT_S,
    FailoverRpcClient,
    LeaderFollower,
    check_master,
    parse_master,
)
from kvpool.config import parse_size
from kvpool.errors import (
    ErrorCode,
    InvalidParams,
    KVPoolError,
    NotLeader,
    StoreClosed,
    TransferError,
    error_for_code,
    raise_for_code,
)
from kvpool.protocol.messages import (
    ClientId,
    ClientStatus,
    HostId,
    MountSegment,
    Ping,
    PingReply,
    RemountReply,
    ReMountSegment,
    ReplicaKind,
    Reply,
    Response,
    SegmentInfo,
    SegmentName,
    UnmountSegment,
)
from kvpool.rpc.client import RpcClient
from kvpool.rpc.spin import DEFAULT_REPLY_POLL_S
from kvpool.rpc.tls import TlsConfig
from kvpool.transfer.hostid import host_id
from kvpool.transfer.memory import SegmentMemory
from kvpool.transfer.server import TransferServer

__all__ = [
    "Heartbeat",
    "HeartbeatStats",
    "NodeRuntime",
    "bind_transfer_server",
    "check_port_range",
]

log = logging.getLogger(__name__)

DEFAULT_RPC_TIMEOUT_S = 10.0
UNMOUNT_TIMEOUT_S = 2.0
MIN_SEGMENT_SIZE = 1 << 12
"""Mooncake refuses segments under 1 KiB; a page is the least that makes sense with mmap."""
MAX_PORT_TRIES: Final = 4096
"""Most ports of a `transfer_ports` range tried before `bind_transfer_server` gives up."""


def check_port_range(value: object, name: str) -> tuple[int, int]:
    """`value` as a (low, high) pair of ports, 1 <= low <= high <= 65535 (a list of two, as a
    config file gives it, too); `InvalidParams` naming `name` otherwise."""
    if isinstance(value, tuple | list) and len(value) == 2:
        low, high = value
        if (
            isinstance(low, int)
            and isinstance(high, int)
            and not isinstance(low, bool)
            and not isinstance(high, bool)
            and 1 <= low <= high <= 65535
        ):
            return low, high
    raise InvalidParams(
        f"{name}: expected (low, high) ports with 1 <= low <= high <= 65535, got {value!r:.80}"
    )


def bind_transfer_server(
    host: str, ports: tuple[int, int] | None = None, **server: Any
) -> TransferServer:
    """A `TransferServer` on `host` (built with the keyword arguments `server`): on a port the
    OS picks (`ports` None), or on a free port of [`ports[0]`, `ports[1]`], tried in a random
    order (as Mooncake's transfer engine picks its RPC port) at most `MAX_PORT_TRIES` times.
    Raises `TransferError` naming the range when no port of it could be bound; other failures
    (a bad host) as they come."""
    if ports is None:
        return TransferServer(host=host, port=0, **server)
    low, high = check_port_range(ports, "transfer_ports")
    candidates = list(range(low, high + 1))
    random.shuffle(candidates)
    tried = candidates[:MAX_PORT_TRIES]
    for port in tried:
        try:
            return TransferServer(host=host, port=port, **server)
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
    raise TransferError(
        f"transfer server: no free port on {host} in {low}..{high} ({len(tried)} tried, all "
        "in use); widen transfer_port_range or free a port"
    )


@dataclass(slots=True)
class HeartbeatStats:
    """What the heartbeat saw (read by health checks, status lines and tests)."""

    pings: int = 0
    failures: int = 0
    """Failed pings in a row right now."""
    total_failures: int = 0
    remounts: int = 0
    reconnects: int = 0
    switches: int = 0
    """Leader switches acted on (an HA master moved)."""
    last_ok: float = 0.0
    """time.monotonic() of the last successful Ping (0: none yet)."""


class Heartbeat:
    """A daemon thread that pings the master for one `NodeRuntime`; see the module docstring.

    The thread is the only caller of `NodeRuntime.remount()` and `NodeRuntime.reconnect()`
    besides `start()`, so recovery never races with itself.
    """

    def __init__(
        self,
        node: NodeRuntime,
        interval: float = 1.0,
        max_failures: int = 3,
        max_backoff: float = 8.0,
    ) -> None:
        if interval <= 0:
            raise InvalidParams(f"heartbeat interval must be > 0 s, got {interval}")
        self.node = node
        self.interval = interval
        self.max_failures = max_failures
        self.max_backoff = max(max_backoff, interval)
        self.stats = HeartbeatStats()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._switched = False
        self._switch_retries = 0
        self._thread = threading.Thread(
            target=self._run, name=f"kvpool-heartbeat-{node.client_id[:8]}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def leader_changed(self) -> None:
        """The master moved (an HA leader switch): beat now, remounting first. Any thread."""
        self._switched = True
        self._wake.set()

    def _run(self) -> None:
        delay = self.interval
        while True:
            self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                delay = self.beat()
            except Exception:  # the heartbeat must outlive any one beat's surprise
                log.exception("heartbeat to %s failed unexpectedly", self.node.master)
                delay = self.interval

    def beat(self) -> float:
        """One ping (and whatever recovery it calls for); returns the delay before the next."""
        st = self.stats
        if self._switched:
            self._switched = False
            if not self._after_switch():
                # The new leader published itself before it serves (it is still taking
                # over): ask again soon, not a whole interval later.
                self._switch_retries += 1
                return float(min(0.05 * 2.0 ** min(self._switch_retries, 8), self.interval))
            self._switch_retries = 0
        try:
            reply = self.node.ping()
        except KVPoolError as exc:
            st.failures += 1
            st.total_failures += 1
            listener = self.node.on_heartbeat
            if listener is not None:
                listener(False)
            log.debug("ping %d failed: %s", st.failures, exc)
            if st.failures < self.max_failures:
                return self.interval
            if st.failures == self.max_failures:
                log.warning("%d pings failed; reconnecting to %s", st.failures, self.node.master)
            with contextlib.suppress(KVPoolError):
                self.node.reconnect()
                st.reconnects += 1
            over = st.failures - self.max_failures
            return float(min(self.interval * 2.0 ** min(over, 16), self.max_backoff))
        st.pings += 1
        lost = st.failures > 0 or reply.client_status == ClientStatus.NEED_REMOUNT
        listener = self.node.on_heartbeat
        if listener is not None:
            # Before a remount: whatever this client holds from the master (arenas) must be
            # given up when the master forgot it or could not be reached.
            listener(not lost)
        if st.failures:
            log.info("master %s answers again after %d failed pings", self.node.master, st.failures)
        st.failures = 0
        st.last_ok = time.monotonic()
        if reply.pending_tasks > 0:
            waker = self.node.on_pending_tasks
            if waker is not None:
                waker()
        if reply.client_status == ClientStatus.NEED_REMOUNT:
            try:
                self.node.remount()
                st.remounts += 1
                log.info("remounted %d segment(s) at %s", len(self.node.segments), self.node.master)
            except KVPoolError as exc:
                log.warning("remount failed (will retry on the next ping): %s", exc)
        return self.interval

    def _after_switch(self) -> bool:
        """A new leader: what the old one lent is given up, the segments are remounted now;
        False when the remount failed (it is tried again)."""
        st = self.stats
        st.switches += 1
        listener = self.node.on_heartbeat
        if listener is not None:
            listener(False)
        try:
            self.node.remount()
        except KVPoolError as exc:
            log.warning(
                "remount at the new leader %s failed (retried): %s", self.node.rpc.address, exc
            )
            self._switched = True  # again at the next beat
            # Calls stay held (each up to its own deadline): before the remount the new leader
            # holds this node's segments silent, and would answer their keys "not found".
            return False
        self.node.release_calls()
        st.remounts += 1
        st.failures = 0
        log.info(
            "remounted %d segment(s) at the new leader %s",
            len(self.node.segments),
            self.node.rpc.address,
        )
        return True

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.node.release_calls()  # nothing will remount any more: held calls go (and fail)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)


class NodeRuntime:
    """This process as a member of the pool at `master` (see the module docstring).

    Thread-safe: mounts, remounts and close are serialised by one lock; `rpc` may be used by
    any thread (the RPC client pipelines concurrent calls).
    """

    def __init__(
        self,
        master: str,
        *,
        host: str = "127.0.0.1",
        rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S,
        heartbeat_interval: float = 1.0,
        cluster_id: str = "kvpool",
        name: str = "kvpool-client",
        failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT_S,
        token: bytes | None = None,
        tls: TlsConfig | None = None,
        transfer_ports: tuple[int, int] | None = None,
        reply_poll: float = DEFAULT_REPLY_POLL_S,
    ) -> None:
        url = parse_master(master)
        self._reply_poll = reply_poll
        self._token = token
        #: TLS of this process's TCP connections (`kvpool.rpc.tls`; None: plain): the client
        #: side of the RPC and the transfers, and the server side of its transfer server.
        self.tls = tls
        self.tls_client = tls.client_context() if tls is not None else None
        self._tls_server = tls.server_context() if tls is not None and tls.cert else None
        cluster_id = check_master(master, cluster_id)
        self.master = master
        self.host = host
        self.name = name
        self.client_id = ClientId(uuid.uuid4().hex)
        self.host_id = HostId(host_id())
        self._rpc_timeout = rpc_timeout
        self._cluster_id = cluster_id
        self._failover_timeout = failover_timeout
        #: Follows the leader of an `etcd://` master (None for "host:port").
        self.follower = LeaderFollower(url) if url is not None else None
        self._lock = threading.RLock()
        self._closed = False
        self.segments: dict[SegmentName, tuple[SegmentMemory, SegmentInfo]] = {}
        # Segment numbers are never reused: a peer may still cache where an unmounted
        # segment was, and must not find another segment under its name.
        self._numbers = itertools.count()
        self._server: TransferServer | None = None
        #: The range the transfer server's port is taken from (None: any the OS picks).
        self.transfer_ports = transfer_ports
        #: The segments the master kept, with their objects, at the last remount (it held
        #: this client as silent and the generations matched); empty after a fresh mount.
        self.restored: list[SegmentName] = []
        try:
            self.rpc = self._connect()
        except BaseException:
            if self.follower is not None:
                self.follower.close()
            raise
        self.heartbeat = Heartbeat(self, interval=heartbeat_interval)
        if isinstance(self.rpc, FailoverRpcClient):
            # Calls wait for the remount after a switch: before it, the new leader has no
            # room on this node's segments (a put would fail NO_AVAILABLE_HANDLE).
            self.rpc.hold_on_switch = True
        if self.follower is not None:
            self.follower.subscribe(lambda _view: self.heartbeat.leader_changed())
            self.follower.start()
        self.on_pending_tasks: Callable[[], None] | None = None
        """Called by the heartbeat when a Ping says replica tasks wait for this client (the
        `TaskExecutor` of `kvpool.client.tasks` sets it to its `wake`)."""
        self.on_remount: Callable[[list[SegmentName]], None] | None = None
        """Called after every successful (re)registration with the segments the master kept
        (a disk tier registers its objects again when its segment was not among them)."""
        self.on_heartbeat: Callable[[bool], None] | None = None
        """Called by the heartbeat after every Ping: True when the master answered and knows
        this client, False when the Ping failed or answered NEED_REMOUNT (the master restarted
        or expired this client). The Store's arenas (`kvpool.client.arena`) listen."""

    def _connect(self) -> RpcClient:
        follower = self.follower
        if follower is not None:
            return FailoverRpcClient(
                follower,
                follower.leader(self._failover_timeout),
                failover_timeout=self._failover_timeout,
                response_type=Response,
                cluster_id=self._cluster_id,
                client_name=self.name,
                timeout=self._rpc_timeout,
                token=self._token,
                tls=self.tls_client,
                reply_poll=self._reply_poll,
            )
        return RpcClient(
            self.master,
            response_type=Response,
            cluster_id=self._cluster_id,
            client_name=self.name,
            timeout=self._rpc_timeout,
            token=self._token,
            tls=self.tls_client,
            reply_poll=self._reply_poll,
        )

    # -------------------------------------------------------------- lifecycle

    def start(self) -> NodeRuntime:
        """Register with the master (raises RpcError when it is unreachable), start pinging.

        With an HA master a leader may already be named in etcd while it is still taking over
        (it answers NOT_LEADER): registering is tried again until `failover_timeout`."""
        deadline = time.monotonic() + self._failover_timeout
        delay = 0.05
        while True:
            try:
                self.remount()
                break
            except NotLeader:
                if self.follower is None or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)  # a bounded back-off while the new leader takes over
                delay = min(delay * 2, 0.5)
        self.heartbeat.stats.last_ok = time.monotonic()
        self.heartbeat.start()
        return self

    def check_open(self) -> None:
        if self._closed:
            raise StoreClosed("this client is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def ping(self) -> PingReply:
        reply = self.rpc.call_as(Ping(self.client_id), PingReply)
        raise_for_code(reply.code, "Ping")
        return reply

    def remount(self) -> None:
        """(Re)register this client with all of its segments (idempotent at the master).

        Holds the lock through the call: a remount carrying a segment that `unmount` is
        taking away, answered after the UnmountSegment, would mount it again at the master.
        """
        with self._lock:
            infos = [info for _, info in self.segments.values()]
            reply = self.rpc.call_as(ReMountSegment(self.client_id, self.host_id, infos), Reply)
        raise_for_code(reply.code, f"ReMountSegment of {len(infos)} segment(s)")
        restored = reply.restored if isinstance(reply, RemountReply) else []
        if restored:
            log.info(
                "master %s kept %d segment(s) with their objects: %s",
                self.master,
                len(restored),
                ", ".join(restored),
            )
        self.restored = list(restored)
        hook = self.on_remount
        if hook is not None:
            hook(self.restored)

    def release_calls(self) -> None:
        """After a leader switch: the remount was tried, let the held calls go."""
        if isinstance(self.rpc, FailoverRpcClient):
            self.rpc.release()

    def reconnect(self) -> None:
        """Drop the control-plane connection: calls in flight on it fail with `RpcError`, and
        the next call connects anew. The client object stays the same, so no caller that took
        `self.rpc` a moment earlier can meet a closed client (`StoreClosed` on a live Store)."""
        with self._lock:
            if self._closed:
                return
        follower = self.follower
        if follower is not None:
            before = self.rpc.address
            view = follower.refresh()  # a newer leader retargets `rpc` through its listener
            if view is not None and view.address != before:
                return
        self.rpc.reconnect()

    # -------------------------------------------------------------- segments

    def mount(
        self,
        size: int | str,
        on_created: Callable[[SegmentMemory], None] | None = None,
        *,
        path: str | None = None,
        offset: int = 0,
        kind: ReplicaKind = ReplicaKind.MEMORY,
    ) -> SegmentMemory:
        """Create, serve and mount a new segment of `size` bytes; returns its memory.

        The memory is a new memfd, or with `path` the bytes [offset, offset + size) of that
        regular file (`SegmentMemory.map_file`; a LOCAL_DISK `kind` maps it without faulting
        it in: a disk tier, `kvpool.client.disk`). `on_created(mem)` runs after the memory
        exists and before the master is told (the Store attaches it to its engine there).
        Nothing is left behind when this fails.
        """
        nbytes = parse_size(size, name="segment_size", minimum=MIN_SEGMENT_SIZE)
        with self._lock:
            self.check_open()
            if self._server is None:
                # With credentials, peers prove the key the master handed us (docs/security.md).
                if self.tls is not None and self._tls_server is None:
                    raise InvalidParams("TLS: serving a segment needs tls_cert and tls_key")
                self._server = bind_transfer_server(
                    self.host,
                    self.transfer_ports,
                    data_key=lambda: self.rpc.data_key,
                    tls=self._tls_server,
                )
            server = self._server
            name = SegmentName(f"{server.endpoint}/{next(self._numbers)}")
            if path is None:
                mem = SegmentMemory.create(name, nbytes)
            else:
                disk = kind is not ReplicaKind.MEMORY
                mem = SegmentMemory.map_file(
                    name, path, nbytes, offset, populate=not disk, share=disk
                )
            try:
                server.add_segment(mem)
                if on_created is not None:
                    on_created(mem)
                info = SegmentInfo(
                    name=SegmentName(mem.name),
                    size=mem.size,
                    host_id=self.host_id,
                    endpoint=server.endpoint,
                    shm_path=mem.shm_path,
                    client_id=self.client_id,
                    # Names this memory: a pause is survived only by the same memory.
                    generation=secrets.randbits(64) or 1,
                    kind=kind,
                )
                reply = self.rpc.call_as(MountSegment(self.client_id, self.host_id, info), Reply)
                raise_for_code(reply.code, f"MountSegment {name}")
            except BaseException:
                mem.close()
                raise
            self.segments[info.name] = (mem, info)
        log.info("mounted segment %s (%d bytes) at %s", info.name, info.size, self.master)
        return mem

    def unmount(self, name: SegmentName, *, best_effort: bool = True) -> None:
        """Unmount one segment at the master (which drops the replicas it held), then stop
        serving it and unmap it.

        Raises `SegmentError` (SEGMENT_NOT_FOUND) for a name this process does not own. With
        `best_effort` (close()), a master that cannot be told is logged and the memory goes
        anyway (a dead master expires us). Without it, a failed UnmountSegment raises and the
        segment stays mounted and served, so the master never names memory that is gone.
        """
        with self._lock:
            entry = self.segments.get(name)
            if entry is None:
                raise error_for_code(
                    ErrorCode.SEGMENT_NOT_FOUND, f"segment {name!r} is not mounted by this process"
                )
            mem, _ = entry
            try:
                # Bounded: close() must not hang on a master that is gone.
                timeout = UNMOUNT_TIMEOUT_S if best_effort else self._rpc_timeout
                reply = self.rpc.call_as(
                    UnmountSegment(self.client_id, name), Reply, timeout=timeout
                )
                if not best_effort:
                    raise_for_code(reply.code, f"UnmountSegment {name}")
                elif reply.code != 0:
                    log.warning("UnmountSegment %s answered %d", name, reply.code)
            except KVPoolError as exc:
                if not best_effort:
                    raise
                log.warning("could not unmount %s at %s: %s", name, self.master, exc)
            del self.segments[name]
        mem.close()
        log.info("unmounted segment %s", name)

    @property
    def transfer_server(self) -> TransferServer | None:
        """The server of this node's segments (None before the first mount), for metrics."""
        return self._server

    @property
    def endpoint(self) -> str | None:
        """`host:port` of this process's transfer server (None before the first mount)."""
        return self._server.endpoint if self._server is not None else None

    def close(self) -> None:
        """Stop pinging, unmount and free every segment, close the connection. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.heartbeat.stop()
        for name in list(self.segments):
            with contextlib.suppress(Exception):
                self.unmount(name)
        if self._server is not None:
            self._server.close()
            self._server = None
        self.rpc.close()
        if self.follower is not None:
            self.follower.close()

    def __enter__(self) -> NodeRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
