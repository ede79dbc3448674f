"""`InvalidationHub`: the master's side of the invalidation stream (`kvpool.protocol.invalidation`).

A `MetadataObserver` of the core (`kvpool.master.core`): every object that leaves the index
(`object_removed`: removed, evicted, replaced, forgotten), loses replicas (`replicas_lost`), loses
a disk or DFS replica or is promoted from one to memory (`tier_changed`), or is rewritten in
place (`object_rewritten`, called by `MetadataCore.rewrite_object`) has its key
queued for each connection subscribed to its tenant; one callback per loop turn then pushes one
`Invalidate` per connection with what was queued. A segment unmounted or silenced invalidates
everything (its objects may be many; a client that remembered a place there re-asks anyway).

Bounds: at most `MAX_PENDING_KEYS` keys and `_MAX_PENDING_BYTES` bytes of keys per connection
between two pushes, and at most `max_subscribers` subscribed connections; past a queue's bound,
or when a connection does not take the push (closed, or its peer not reading), its keys are
dropped and an `Invalidate(everything=True)` is owed to it instead (sent at the next push that
goes through). A closed connection's subscription is dropped at the next push (or when the
subscriber limit is met), and a tenant's entry with its last subscription; a Subscribe naming
a tenant longer than `MAX_TENANT_CHARS` is refused, and a refused one keeps nothing, so the
hub's memory is bounded by its subscriptions. Everything runs on the master's loop (the core's
owner): nothing locks.

The hub is installed by `MasterServer` around its request handler (`wrap`), which serves
`Subscribe` with the connection it came on and attaches the hub to the `MetadataCore` served
then (an HA master installs a new one when it leads; its clients reconnect and subscribe).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

from kvpool.codes import INVALID_PARAMS, OK, UNAVAILABLE_IN_CURRENT_STATUS
from kvpool.master.core import MetadataCore
from kvpool.master.metadata import ObjectMeta
from kvpool.master.segments import Segment
from kvpool.protocol.invalidation import MAX_PENDING_KEYS, PUSH_REQUEST_ID, Invalidate, Subscribe
from kvpool.protocol.messages import ClientId, Reply, TenantId
from kvpool.rpc.server import Connection

__all__ = ["InvalidationHub"]

log = logging.getLogger(__name__)

_MAX_PENDING_BYTES: Final = 1 << 20
"""Bytes of keys queued per connection between two pushes (a frame well under the limit)."""
_MAX_SUBSCRIBERS: Final = 4096
MAX_TENANT_CHARS: Final = 255
"""Longest tenant a Subscribe may name (a Store's own limit); longer: INVALID_PARAMS."""

Handler = Callable[[Any, Connection], Any]


class _Queue:
    """What one subscribed connection is owed."""

    __slots__ = ("conn", "everything", "keys", "nbytes", "tenant")

    def __init__(self, conn: Connection, tenant: TenantId) -> None:
        self.conn = conn
        self.tenant = tenant
        self.keys: list[str] = []
        self.nbytes = 0
        self.everything = False


class InvalidationHub:
    """Subscriptions by tenant and what each is owed (module docstring)."""

    def __init__(self, max_subscribers: int = _MAX_SUBSCRIBERS) -> None:
        self.max_subscribers = max_subscribers
        self._by_tenant: dict[TenantId, dict[int, _Queue]] = {}
        self._count = 0
        self._scheduled = False
        self._cores: set[int] = set()
        #: Pushes sent, and keys dropped into an `everything` (for tests and status).
        self.pushes = 0
        self.overflows = 0

    # ------------------------------------------------------------------ installation

    def attach(self, core: MetadataCore) -> None:
        """Observe `core` (idempotent)."""
        if id(core) not in self._cores:
            self._cores.add(id(core))
            core.observe(self)

    def wrap(
        self,
        inner: Handler,
        core: Callable[[], MetadataCore],
        leading: Callable[[], bool] | None = None,
    ) -> Handler:
        """`inner`, with `Subscribe` served here (it needs the connection). `core` answers the
        core served now: each Subscribe attaches to it (an HA leader's new core is attached
        by the first client that subscribes there). `leading` (an HA master's): while it
        answers False, Subscribe goes to `inner`, which refuses it (NOT_LEADER, naming the
        leader)."""

        def handle(request: Any, conn: Connection) -> Any:
            if type(request) is Subscribe:
                if leading is not None and not leading():
                    return inner(request, conn)
                self.attach(core())
                return self.subscribe(request, conn)
            return inner(request, conn)

        return handle

    def subscribe(self, req: Subscribe, conn: Connection) -> Reply:
        """Push invalidations of `req.tenant` to `conn` from now on (idempotent per
        connection); UNAVAILABLE_IN_CURRENT_STATUS past `max_subscribers` (the client then relies on its
        TTL alone)."""
        tenant = req.tenant
        if not isinstance(tenant, str) or not 0 < len(tenant) <= MAX_TENANT_CHARS:
            return Reply(INVALID_PARAMS)
        subs = self._by_tenant.get(tenant)
        if subs is not None and id(conn) in subs:
            return Reply(OK)
        if self._count >= self.max_subscribers:
            self._prune()
            if self._count >= self.max_subscribers:
                return Reply(UNAVAILABLE_IN_CURRENT_STATUS)
        if subs is None:  # (added only once admitted: a refusal keeps nothing)
            subs = self._by_tenant[tenant] = {}
        subs[id(conn)] = _Queue(conn, tenant)
        self._count += 1
        return Reply(OK)

    # ------------------------------------------------------------------ MetadataObserver

    def object_removed(self, obj: ObjectMeta) -> None:
        self._note(obj.tenant, obj.key)

    def replicas_lost(self, obj: ObjectMeta) -> None:
        self._note(obj.tenant, obj.key)

    def object_rewritten(self, obj: ObjectMeta) -> None:
        self._note(obj.tenant, obj.key)

    def tier_changed(self, obj: ObjectMeta) -> None:
        """A disk or DFS replica of `obj` left it, or it was promoted to memory
        (`MetadataCore._tier_changed`)."""
        self._note(obj.tenant, obj.key)

    def segment_mounted(self, seg: Segment) -> None:
        pass

    def segment_unmounted(self, seg: Segment) -> None:
        self._everything()

    def segment_restored(self, seg: Segment) -> None:
        pass

    def client_expired(self, client_id: ClientId) -> None:
        pass

    def client_silenced(self, client_id: ClientId) -> None:
        self._everything()

    # ------------------------------------------------------------------ queues

    def _note(self, tenant: TenantId, key: str) -> None:
        subs = self._by_tenant.get(tenant)
        if not subs:
            return
        size = len(key) + 8
        for q in subs.values():
            if q.everything:
                continue
            if len(q.keys) >= MAX_PENDING_KEYS or q.nbytes + size > _MAX_PENDING_BYTES:
                self._overflow(q)
                continue
            q.keys.append(key)
            q.nbytes += size
        self._schedule()

    def _everything(self) -> None:
        if not self._count:
            return
        for subs in self._by_tenant.values():
            for q in subs.values():
                self._overflow(q)
        self._schedule()

    def _overflow(self, q: _Queue) -> None:
        if not q.everything:
            self.overflows += 1
        q.everything = True
        q.keys = []
        q.nbytes = 0

    def _schedule(self) -> None:
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a core driven outside a loop (tools, tests): push now
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Push every queue that holds something; drop the subscriptions of closed
        connections."""
        self._scheduled = False
        for tenant, subs in list(self._by_tenant.items()):
            for cid, q in list(subs.items()):
                if q.conn.closed:
                    del subs[cid]
                    self._count -= 1
                    continue
                if not q.everything and not q.keys:
                    continue
                msg = Invalidate(q.tenant, [] if q.everything else q.keys, q.everything)
                if q.conn.push(PUSH_REQUEST_ID, msg):
                    self.pushes += 1
                    q.keys = []
                    q.nbytes = 0
                    q.everything = False
                else:
                    self._overflow(q)  # owed once the peer reads again
            if not subs:
                del self._by_tenant[tenant]

    def _prune(self) -> None:
        for tenant, subs in list(self._by_tenant.items()):
            for cid, q in list(subs.items()):
                if q.conn.closed:
                    del subs[cid]
                    self._count -= 1
            if not subs:
                del self._by_tenant[tenant]
