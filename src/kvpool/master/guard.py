"""Segment ownership checks the master makes on every connection, credentials or not.

Without credentials every process that reaches the master is trusted (docs/security.md), but a
few things one process could do to another's memory are refused all the same, because no honest
client ever does them:

* **Unmounting a live owner's segment from elsewhere.** A client id is bound to the connection
  that mounted (or remounted, or pinged for) it; while that connection is open, an
  `UnmountSegment` naming the id on any other connection is refused ILLEGAL_CLIENT. (A node's
  RpcClient keeps one connection and sends its unmounts on it; when the connection breaks the
  node's next Ping or remount binds the new one; with credentials, an `admin` token may
  unmount any segment, naming its owner's id from `Stats`.) Client ids are bearer names, and an
  owner between connections is not protected; with credentials they are also hidden from
  non-admins (`kvpool.master.auth`).
* **A segment that names another's shared memory.** A mount whose `shm_path` is the path of a
  serving segment of another client on the same host is refused SEGMENT_ALREADY_EXISTS:
  same-host writers would otherwise copy into the other segment's memory at offsets allocated
  for this one. (Not against silent segments: a restarted node may reuse its dead
  predecessor's pid and fd, so its `/proc/PID/fd/N` path.)
* **A segment whose transfer endpoint is another machine.** A client connected from a remote
  IP may only mount segments whose endpoint host is that IP (or a name, which the master does
  not resolve): it cannot send the pool's writes to a third host. Clients on loopback or the
  Unix socket are local processes, and may name any address of this host.

`SegmentGuard.guard(handler)` wraps the master's RPC handler; requests other than the four
above pass with one set-membership test.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from typing import Any, Final

from kvpool.codes import ILLEGAL_CLIENT, INVALID_PARAMS, SEGMENT_ALREADY_EXISTS
from kvpool.master.segments import SegmentTable
from kvpool.protocol.messages import (
    ClientId,
    MountSegment,
    Ping,
    RemountReply,
    ReMountSegment,
    Reply,
    SegmentInfo,
    UnmountSegment,
)
from kvpool.rpc.server import Connection

__all__ = ["SegmentGuard"]

log = logging.getLogger(__name__)

_WATCHED: Final = frozenset({MountSegment, ReMountSegment, UnmountSegment, Ping})
#: Bindings kept before the closed connections among them are pruned.
_PRUNE_AT: Final = 4096


class SegmentGuard:
    """The checks of the module docstring. Runs on the master's loop; no locks."""

    #: The request types `check` looks at (every other request passes untouched).
    WATCHED: Final = _WATCHED

    def __init__(self, segments: Callable[[], SegmentTable]) -> None:
        self._segments = segments
        self._owner_conn: dict[ClientId, Connection] = {}
        self._prune_at = _PRUNE_AT
        #: Requests refused so far (for tests and logs).
        self.refused = 0

    def guard(self, inner: Callable[[Any, Connection], Any]) -> Callable[[Any, Connection], Any]:
        watched = _WATCHED
        check = self.check

        def handle(request: Any, conn: Connection) -> Any:
            if type(request) in watched:
                refusal = check(request, conn)
                if refusal is not None:
                    return refusal
            return inner(request, conn)

        return handle

    def check(self, request: Any, conn: Connection) -> Reply | None:
        """The refusal of `request` on `conn`, or None (binding the client id when it mounts)."""
        client_id: ClientId = request.client_id
        bound = self._owner_conn.get(client_id)
        other_live = bound is not None and bound is not conn and not bound.closed
        if isinstance(request, UnmountSegment):
            principal = conn.principal
            if other_live and (principal is None or not principal.admin):
                return self._refuse(
                    ILLEGAL_CLIENT, conn, f"unmount of {request.name!r} for client {client_id}"
                )
            return None
        if isinstance(request, Ping):
            if bound is None or not other_live:
                self._bind(client_id, conn)
            return None
        infos = [request.segment] if isinstance(request, MountSegment) else request.segments
        for info in infos:
            code = self._check_segment(info, client_id, info.host_id or request.host_id, conn)
            if code is not None:
                return self._refuse(
                    code,
                    conn,
                    f"mount of {info.name!r}",
                    remount=isinstance(request, ReMountSegment),
                )
        if not other_live:
            self._bind(client_id, conn)
        return None

    def _check_segment(
        self, info: SegmentInfo, client_id: ClientId, host_id: str, conn: Connection
    ) -> int | None:
        if info.shm_path:
            for seg in self._segments().live:
                # Same host only (/proc/1/fd/5 exists in every container), and only a serving
                # segment: a restarted node may get its dead predecessor's pid and fd.
                if (
                    seg.shm_path == info.shm_path
                    and seg.host_id == host_id
                    and seg.client_id != client_id
                ):
                    return SEGMENT_ALREADY_EXISTS
        if not _endpoint_allowed(info.endpoint, conn.peer):
            return INVALID_PARAMS
        return None

    def _bind(self, client_id: ClientId, conn: Connection) -> None:
        owners = self._owner_conn
        owners[client_id] = conn
        if len(owners) >= self._prune_at:
            for cid in [c for c, k in owners.items() if k.closed]:
                del owners[cid]
            self._prune_at = max(_PRUNE_AT, 2 * len(owners))

    def _refuse(self, code: int, conn: Connection, what: str, *, remount: bool = False) -> Reply:
        self.refused += 1
        log.warning("refused %s from connection %s (%s)", what, conn.conn_id, conn.peer)
        return RemountReply(code) if remount else Reply(code)


def _endpoint_allowed(endpoint: str, peer: str) -> bool:
    """Whether a client connected from `peer` ("ip:port", or "unix") may name `endpoint`."""
    if not endpoint or peer in {"", "unix"}:
        return True
    peer_host = peer.rsplit(":", 1)[0].strip("[]")
    try:
        peer_ip = ipaddress.ip_address(peer_host)
    except ValueError:
        return True
    if peer_ip.is_loopback:
        return True
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return True  # a name: not resolved on the master's loop
    if isinstance(peer_ip, ipaddress.IPv6Address) and peer_ip.ipv4_mapped is not None:
        peer_ip = peer_ip.ipv4_mapped
    return ip == peer_ip
