"""Following the leader of a highly available cluster: `etcd://` master addresses.

Wherever a Store or a node takes a master's "HOST:PORT" it also takes
`etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID` (`kvpool.ha.url.EtcdUrl`; the cluster id is the
RPC cluster id too). Then:

* `LeaderFollower` reads the leader key once at start (waiting up to `failover_timeout` while no
  master leads), and follows it (`LeaderDiscovery.start()`: a watch, a re-read every 10 s, a new
  watch after any break). It keeps the highest term seen and refuses older views.
* `FailoverRpcClient` is the `RpcClient` such a Store or node uses: the same object for the
  whole life of the Store (callers hold it), `retarget`ed to each newer leader the follower
  reports, with the leader's term as `min_term` (a master whose handshake names an older term
  is refused). Its `call` retries what is safe to retry when the leader changes under a call,
  and fails with a clear code what is not (the table below and docs/parts/ha-client.md).
* The node's heartbeat (`kvpool.client.node`) asks the follower again after 3 failed pings and
  remounts its segments at once after a switch.

A plain "HOST:PORT" master builds a plain `RpcClient`: nothing here runs, the hot path is the
same code as without HA.

Retry policy by request kind, when a call fails with NOT_LEADER (the master applied nothing),
LEADER_CHANGED, a broken connection or a timeout (the outcome is unknown); every retry waits
for a leader (discovery) within `failover_timeout` of the failure:

=====================================  =======================================================
kind                                   after the failure
=====================================  =======================================================
reads (GetReplicaList, Exist, GetSize, asked again on the leader
Stats, locations, GetSegment, QueryTask)
idempotent writes (PutRevoke, Unmount, asked again (a second revoke or release finds nothing)
ReleaseArenas, ReserveArena, clears)
Ping, ReMountSegment                   not retried here: the heartbeat has its own rule; a
                                       NOT_LEADER still makes the follower look again at once
PutStart / UpsertStart (and batches)   outcome unknown: this client's own in-flight put of
                                       the key(s) is revoked at the leader, then asked again
PutEnd / PutCommit (and batches)       outcome unknown: the key is looked up at the leader;
                                       COMPLETE with the same checksum (and size) is success
                                       (its own bytes); otherwise the end/commit is sent again
                                       once; a PutEnd still refused raises LEADER_CHANGED
                                       (`Writer.put_one` then puts again from PutStart)
Remove / BatchRemove                   asked again; OBJECT_NOT_FOUND then counts as removed
                                       only when the first attempt's outcome was unknown
anything else (MountSegment, tasks)    NOT_LEADER: asked again; unknown: LEADER_CHANGED
=====================================  =======================================================
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from kvpool.codes import OBJECT_ALREADY_EXISTS, OBJECT_NOT_FOUND, OK
from kvpool.errors import ErrorCode, InvalidParams, NotLeader, RpcError
from kvpool.ha.coordinator import Coordinator, CoordinatorError
from kvpool.ha.discovery import LeaderDiscovery
from kvpool.ha.gateway import EtcdGateway
from kvpool.ha.keys import ClusterKeys
from kvpool.ha.leader import LeaderView
from kvpool.ha.url import SCHEME, EtcdUrl
from kvpool.override import override
from kvpool.protocol import messages as m
from kvpool.rpc.client import RpcClient, parse_address

__all__ = [
    "DEFAULT_CLUSTER_ID",
    "DEFAULT_FAILOVER_TIMEOUT_S",
    "FailoverRpcClient",
    "LeaderFollower",
    "Policy",
    "check_master",
    "parse_master",
    "policy_of",
]

log = logging.getLogger(__name__)

DEFAULT_FAILOVER_TIMEOUT_S: Final = 10.0
"""Seconds a call waits for a (new) leader after the one it asked failed."""
DEFAULT_CLUSTER_ID: Final = "kvpool"
"""A cluster id left at this default takes the `etcd://` URL's; any other must match it."""
_ETCD_TIMEOUT_S: Final = 2.0
_MAX_BACKOFF_S: Final = 0.5


def parse_master(master: str) -> EtcdUrl | None:
    """The `EtcdUrl` of an `etcd://` master, None for a "HOST:PORT" one; `InvalidParams`
    naming the value for anything else."""
    if not isinstance(master, str):
        raise InvalidParams(f"master: expected 'host:port' or etcd://..., got {master!r}")
    if master.strip().lower().startswith(SCHEME):
        try:
            return EtcdUrl.parse(master)
        except InvalidParams as exc:
            raise InvalidParams(f"master: {exc.message}") from None
    try:
        parse_address(master)
    except InvalidParams:
        raise InvalidParams(
            f"master: expected 'host:port' or etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID, "
            f"got {master!r}"
        ) from None
    return None


def check_master(master: str, cluster_id: str) -> str:
    """The cluster id to use with `master`: `cluster_id`, or the `etcd://` URL's when
    `cluster_id` is the default; `InvalidParams` when both are given and differ."""
    url = parse_master(master)
    if url is None or cluster_id == url.cluster_id:
        return cluster_id
    if cluster_id == DEFAULT_CLUSTER_ID:
        return url.cluster_id
    raise InvalidParams(
        f"cluster_id {cluster_id!r} conflicts with the cluster {url.cluster_id!r} of {master!r}"
    )


class LeaderFollower:
    """Find and follow the leader of the cluster at `url` (module docstring).

    Listeners (`subscribe`) run on the thread that learned of a newer leader: the discovery
    thread, or a caller that asked etcd again (`refresh`). Thread-safe.
    """

    def __init__(
        self,
        url: EtcdUrl,
        *,
        coordinator: Coordinator | None = None,
        etcd_timeout: float = _ETCD_TIMEOUT_S,
        resync_interval: float = 10.0,
    ) -> None:
        self.url = url
        self._own = coordinator is None
        self._coord = coordinator or EtcdGateway(url.endpoints, timeout=etcd_timeout)
        self._listeners: list[Callable[[LeaderView], None]] = []
        self._lock = threading.Lock()
        self.discovery = LeaderDiscovery(
            self._coord,
            ClusterKeys(url.cluster_id),
            resync_interval=resync_interval,
            timeout=etcd_timeout,
            on_change=self._changed,
        )
        self._started = False

    def subscribe(self, listener: Callable[[LeaderView], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def current(self) -> LeaderView | None:
        return self.discovery.current()

    def leader(self, timeout: float) -> LeaderView:
        """The leader, read from etcd now; while none leads (or etcd does not answer), asked
        again until `timeout` s have passed, then `NotLeader` (NOT_LEADER) saying why."""
        deadline = time.monotonic() + timeout
        last = "no leader key"
        while True:
            try:
                view = self.discovery.resolve()
            except CoordinatorError as exc:
                view, last = None, f"etcd: {exc.message}"
            if view is not None:
                return view
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotLeader(
                    f"no leader of cluster {self.url.cluster_id!r} at {self.url} within "
                    f"{timeout:g} s ({last})",
                    ErrorCode.NOT_LEADER,
                )
            current = self.discovery.current()
            self.discovery.wait_for((current.term if current else 0) + 1, min(left, 0.2))

    def refresh(self) -> LeaderView | None:
        """Ask etcd now (after failed pings, or a NOT_LEADER answer); the newest leader known
        (listeners have run when it is new). etcd's faults are logged, not raised."""
        try:
            self.discovery.refresh()
        except CoordinatorError as exc:
            log.info("leader of %s: etcd did not answer: %s", self.url.cluster_id, exc.message)
        return self.discovery.current()

    def start(self) -> None:
        """Follow the leader key on a thread (idempotent)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        self.discovery.start()

    def _changed(self, view: LeaderView) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(view)
            except Exception:  # one listener's fault must not stop the others or discovery
                log.exception("leader listener failed for %s", view)

    def close(self) -> None:
        """Stop following; closes the etcd client it made. Idempotent."""
        self.discovery.close()
        if self._own:
            self._coord.close()


class Policy(enum.Enum):
    """How `FailoverRpcClient` treats a request whose master failed (module docstring)."""

    READ = "read"
    IDEMPOTENT = "idempotent"
    PASS = "pass"
    START = "start"
    FINISH = "finish"
    REMOVE = "remove"
    UNSAFE = "unsafe"


_POLICIES: Final[dict[type[Any], Policy]] = {
    m.Echo: Policy.READ,
    m.Barrier: Policy.READ,
    m.GetSegment: Policy.READ,
    m.GetReplicaList: Policy.READ,
    m.BatchGetReplicaList: Policy.READ,
    m.BatchGetLocations: Policy.READ,
    m.ExistKey: Policy.READ,
    m.BatchExistKey: Policy.READ,
    m.GetSize: Policy.READ,
    m.Stats: Policy.READ,
    m.QueryTask: Policy.READ,
    m.PutRevoke: Policy.IDEMPOTENT,
    m.BatchPutRevoke: Policy.IDEMPOTENT,
    m.UnmountSegment: Policy.IDEMPOTENT,
    m.ReleaseArenas: Policy.IDEMPOTENT,
    m.ReserveArena: Policy.IDEMPOTENT,
    m.ReportBadReplica: Policy.IDEMPOTENT,
    m.BatchReplicaClear: Policy.IDEMPOTENT,
    m.RemoveAll: Policy.IDEMPOTENT,
    m.RemoveByRegex: Policy.IDEMPOTENT,
    m.Ping: Policy.PASS,
    m.ReMountSegment: Policy.PASS,
    m.PutStart: Policy.START,
    m.UpsertStart: Policy.START,
    m.BatchPutStart: Policy.START,
    m.BatchUpsertStart: Policy.START,
    m.PutEnd: Policy.FINISH,
    m.PutCommit: Policy.FINISH,
    m.BatchPutEnd: Policy.FINISH,
    m.BatchPutCommit: Policy.FINISH,
    m.Remove: Policy.REMOVE,
    m.BatchRemove: Policy.REMOVE,
}


def policy_of(request: object) -> Policy:
    """The retry policy of `request` (UNSAFE for any kind not listed)."""
    return _POLICIES.get(type(request), Policy.UNSAFE)


class FailoverRpcClient(RpcClient):
    """An `RpcClient` that follows the leader of `follower`'s cluster (module docstring).

    Starts at `view`'s address with its term as `min_term`; `failover_timeout` bounds how long
    a failed call waits for a leader before it fails with the last error, its message saying so.
    """

    def __init__(
        self,
        follower: LeaderFollower,
        view: LeaderView,
        *,
        failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(view.address, **kwargs)
        if not failover_timeout > 0:
            raise InvalidParams(f"failover_timeout: {failover_timeout!r} must be > 0 s")
        self.follower = follower
        self.failover_timeout = float(failover_timeout)
        self.min_term = view.term
        #: Calls asked again after their master failed (tests and status read it).
        self.retries = 0
        #: Whether a switch holds calls until `release()` (a node with segments sets it: the
        #: new leader can place nothing on them before the remount).
        self.hold_on_switch = False
        self._released = threading.Event()
        self._released.set()
        follower.subscribe(self._on_leader)

    def _on_leader(self, view: LeaderView) -> None:
        if view.term < self.min_term:
            return
        self.min_term = view.term
        if view.address != self.address and self.hold_on_switch:
            self._released.clear()
        self.retarget(view.address)

    def release(self) -> None:
        """Let calls held since the last switch go (the node remounted, or gave up trying)."""
        self._released.set()

    def _held(self, request: Any, deadline: float) -> None:
        """Wait while a switch holds calls (never Ping / ReMountSegment: they end the hold)."""
        if not self._released.is_set() and policy_of(request) is not Policy.PASS:
            self._released.wait(max(deadline - time.monotonic(), 0.0))

    @override
    def call(self, request: Any, timeout: float | None = None) -> Any:
        if not self._released.is_set():
            self._held(request, time.monotonic() + self.failover_timeout)
        try:
            return super().call(request, timeout)
        except RpcError as exc:
            return self._failed(request, timeout, exc)

    # -- after a failure ------------------------------------------------------------------

    def _failed(self, request: Any, timeout: float | None, exc: RpcError) -> Any:
        policy = policy_of(request)
        # NOT_LEADER (an answer, or a handshake naming an older term): nothing was applied.
        unknown = not (isinstance(exc, NotLeader) and exc.code == ErrorCode.NOT_LEADER)
        if policy is Policy.PASS:
            if not unknown:
                self._look_again()
            raise exc
        deadline = time.monotonic() + self.failover_timeout
        kind = type(request).__name__
        if unknown and policy is Policy.UNSAFE:
            self._await_leader(exc, deadline, 0)
            raise NotLeader(
                f"{kind}: the leader changed or failed while it was asked ({exc.message}); "
                "whether it was applied is unknown",
                ErrorCode.LEADER_CHANGED,
            ) from exc
        if unknown and policy is Policy.START:
            self._revoke_own(request, deadline)
        if unknown and policy is Policy.FINISH:
            return self._settle(request, deadline, exc)
        reply = self._again(request, timeout, deadline, exc)
        if unknown and policy is Policy.REMOVE:
            return _removed(reply)
        return reply

    def _again(
        self,
        request: Any,
        timeout: float | None,
        deadline: float,
        exc: RpcError,
        *,
        once: bool = False,
    ) -> Any:
        """`request` asked again of the leader until it answers or `deadline` passes (`once`:
        an attempt whose outcome is unknown again raises LEADER_CHANGED at once, so the caller
        looks before it sends again)."""
        last: RpcError = exc
        for attempt in range(1 << 30):
            self._await_leader(last, deadline, attempt)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.retries += 1
            self._held(request, deadline)
            left = deadline - time.monotonic()
            budget = min(self.timeout if timeout is None else timeout, max(left, 0.05))
            try:
                return super().call(request, budget)
            except RpcError as err:
                if once and not (isinstance(err, NotLeader) and err.code == ErrorCode.NOT_LEADER):
                    raise NotLeader(err.message, ErrorCode.LEADER_CHANGED) from err
                last = err
        raise type(last)(
            f"{type(request).__name__}: no leader of cluster {self.follower.url.cluster_id!r} "
            f"answered within failover_timeout {self.failover_timeout:g} s "
            f"(last: {last.message})",
            last.code,
        ) from last

    def _look_again(self) -> None:
        view = self.follower.refresh()
        if view is not None:
            self._on_leader(view)

    def _await_leader(self, last: RpcError, deadline: float, attempt: int) -> None:
        """Before asking again: read etcd (a newer leader retargets this client through the
        follower); when the leader is still the one that failed, wait (for a newer one, or a
        back-off) unless this is the first retry of a broken connection."""
        before = self.follower.current()
        view = self.follower.refresh()
        if view is not None and view.address != self.address:
            self._on_leader(view)
            return
        if view is not None and before is not None and view.term > before.term:
            return
        if attempt == 0 and not isinstance(last, NotLeader):
            return  # a blip (the server closed an idle connection): once at once
        left = deadline - time.monotonic()
        if left > 0:
            term = view.term if view is not None else 0
            self.follower.discovery.wait_for(term + 1, min(left, 0.05 * 2**attempt, _MAX_BACKOFF_S))

    def _revoke_own(self, request: Any, deadline: float) -> None:
        """Before a PutStart whose first attempt may have been applied: revoke this client's
        own in-flight put of its key(s) at the leader (a complete object is never revoked;
        another client's put answers ILLEGAL_CLIENT and stays)."""
        revoke: Any
        if isinstance(request, m.PutStart | m.UpsertStart):
            revoke = m.PutRevoke(request.client_id, request.key, request.tenant)
        else:
            revoke = m.BatchPutRevoke(request.client_id, request.keys, request.tenant)
        try:
            self._again(revoke, None, deadline, RpcError("retry"))
        except RpcError as exc:
            log.warning("revoking a put of unknown outcome failed: %s", exc.message)

    def _settle(self, request: Any, deadline: float, exc: RpcError) -> Any:
        """A PutEnd / PutCommit (or batch) whose outcome is unknown: what the leader holds
        decides (module docstring)."""
        if isinstance(request, m.PutEnd | m.PutCommit):
            return self._settle_one(request, deadline, exc)
        keys: list[str] = request.keys
        sums: list[int] = request.checksums
        sizes: list[int] | None = request.sizes if isinstance(request, m.BatchPutCommit) else None
        look = self._committed(m.BatchGetReplicaList(keys, request.tenant), deadline, exc)
        results = getattr(look, "results", [])
        done = [
            len(results) == len(keys)
            and bool(sums)
            and _ours(results[i], sums[i], sizes[i] if sizes is not None else None)
            for i in range(len(keys))
        ]
        rest = [i for i, ok in enumerate(done) if not ok]
        codes = [OK] * len(keys)
        if rest:
            again = _subset_batch(request, rest)
            try:
                reply = self._again(again, None, deadline, exc, once=True)
            except NotLeader as err:  # unknown again: those keys say so, nothing sent twice
                log.warning("%s sent again: %s", type(request).__name__, err.message)
                reply = None
            got = getattr(reply, "codes", [])
            for j, i in enumerate(rest):
                code = got[j] if j < len(got) else int(ErrorCode.LEADER_CHANGED)
                if isinstance(request, m.BatchPutEnd) and code not in (OK, OBJECT_ALREADY_EXISTS):
                    code = int(ErrorCode.LEADER_CHANGED)
                codes[i] = code
        return m.BatchReply(codes)

    def _committed(self, lookup: Any, deadline: float, exc: RpcError) -> Any:
        """`lookup` answered with committed state: asked of the leader, then a `Barrier` at the
        same master (same connection target and term) that succeeded, so everything the lookup
        saw is on that leader's standbys. A lookup alone could see a write the leader applied
        but never got acknowledged (it lost the lead while waiting, or is about to die): trusting
        it would report a put done that the next leader does not have."""
        while True:
            where = (self.epoch, self.address)
            look = self._again(lookup, None, deadline, exc)
            term = self.server_term
            try:
                self._again(m.Barrier(), None, deadline, exc)
            except NotLeader:
                if time.monotonic() >= deadline:
                    raise
                continue
            if (self.epoch, self.address) == where and self.server_term == term:
                return look

    def _settle_one(self, request: m.PutEnd | m.PutCommit, deadline: float, exc: RpcError) -> Any:
        """One PutEnd / PutCommit of unknown outcome: done when the leader holds the key
        COMPLETE with this put's checksum (and size); otherwise sent again, and while that
        answer is unknown again, the same question once more (never a blind second apply)."""
        kind = type(request).__name__
        size = request.size if isinstance(request, m.PutCommit) else None
        while True:
            look = self._committed(m.GetReplicaList(request.key, request.tenant), deadline, exc)
            if _ours(look, request.checksum, size):
                log.info("%s of %r: applied before the leader changed", kind, request.key)
                return m.Reply(OK)
            try:
                reply = self._again(request, None, deadline, exc, once=True)
            except NotLeader as err:
                if err.code != ErrorCode.LEADER_CHANGED or time.monotonic() >= deadline:
                    raise
                exc = err
                continue
            if isinstance(request, m.PutEnd) and getattr(reply, "code", OK) != OK:
                raise NotLeader(
                    f"PutEnd of {request.key!r}: the leader changed during the put and the new "
                    f"leader does not hold it (code {reply.code}); put it again",
                    ErrorCode.LEADER_CHANGED,
                ) from exc
            return reply


def _ours(look: Any, checksum: int | None, size: int | None) -> bool:
    """Whether the leader's answer `look` (a ReplicaListReply) shows the put with `checksum`
    (and `size`) complete."""
    return (
        isinstance(look, m.ReplicaListReply)
        and look.code == OK
        and checksum is not None
        and look.checksum == checksum
        and (size is None or look.size == size)
    )


def _removed(reply: Any) -> Any:
    """A Remove asked again after an unknown outcome: "not found" is the first attempt's
    success."""
    if isinstance(reply, m.BatchReply):
        return m.BatchReply([OK if c == OBJECT_NOT_FOUND else c for c in reply.codes])
    if isinstance(reply, m.Reply) and reply.code == OBJECT_NOT_FOUND:
        return m.Reply(OK)
    return reply


def _subset_batch(request: Any, picked: list[int]) -> Any:
    """A BatchPutEnd / BatchPutCommit for the keys `picked` (indexes) only."""

    def sub(values: list[Any]) -> list[Any]:
        return [values[i] for i in picked] if values else values

    if isinstance(request, m.BatchPutEnd):
        return m.BatchPutEnd(
            request.client_id,
            sub(request.keys),
            sub(request.checksums),
            request.tenant,
            sub(request.replica_ids),
        )
    return m.BatchPutCommit(
        request.client_id,
        request.arena_id,
        sub(request.keys),
        sub(request.sizes),
        sub(request.offsets),
        sub(request.checksums),
        request.config,
        request.tenant,
    )
