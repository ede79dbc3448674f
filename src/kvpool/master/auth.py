"""Credentials of a master: the auth file, and what each role may ask (docs/security.md).

`kvpool master --auth-file PATH` names a YAML file::

    tokens:
      - {token: "a-long-random-secret", tenant: team-a, role: client}
      - {token: "another-secret",       tenant: ops,    role: node}
      - {token: "the-operators-secret", tenant: ops,    role: admin}

`Credentials` loads it into the `TokenTable` the RPC server challenges connections with, and
reloads it on SIGHUP (a file that does not load leaves the tokens as they were). Every request
of a proven connection then passes `RequestPolicy.check`:

* the tenant comes from the token: a request naming another tenant is refused
  PERMISSION_DENIED (nothing is overridden silently; an `admin` token may name any tenant);
* each role has an allow-list of request types (`CLIENT_REQUESTS`, `NODE_REQUESTS`); `admin`
  may ask anything. A request type not on a list (a newly added one included) is admin-only
  until it is listed, so the default is closed;
* a `client` registers with `ReMountSegment` but mounts nothing (segments need a `node`
  token); RemoveAll, RemoveByRegex, copy/move/query tasks and the HA replication requests
  (FollowLog, FetchSnapshot) are admin-only;
* `Stats` and `GetSegment` answer a non-admin with every client id blanked: a client id is
  what a client proves ownership of its puts and segments with, so nobody learns another's;
  the per-tenant usage in `Stats` shows the token's own tenant only.

Without an auth file none of this runs: the handler is the plain one (zero cost).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec
import yaml

from kvpool.errors import InvalidParams, KVPoolError, PermissionDenied, Unauthenticated
from kvpool.protocol.invalidation import Subscribe
from kvpool.protocol.messages import (
    BatchExistKey,
    BatchGetLocations,
    BatchGetReplicaList,
    BatchPutCommit,
    BatchPutEnd,
    BatchPutRevoke,
    BatchPutStart,
    BatchRemove,
    BatchReplicaClear,
    BatchUpsertStart,
    ClientId,
    Echo,
    ExistKey,
    FetchTasks,
    GetReplicaList,
    GetSegment,
    GetSize,
    HaStatus,
    MarkTaskComplete,
    MountSegment,
    Ping,
    PutCommit,
    PutEnd,
    PutRevoke,
    PutStart,
    ReleaseArenas,
    ReMountSegment,
    Remove,
    ReportBadReplica,
    ReserveArena,
    SegmentReply,
    Stats,
    StatsReply,
    UnmountSegment,
    UpsertStart,
)
from kvpool.rpc.auth import Principal, Role, TokenTable
from kvpool.rpc.server import Connection

__all__ = [
    "CLIENT_REQUESTS",
    "NODE_REQUESTS",
    "Credentials",
    "RequestPolicy",
    "load_auth_file",
]

log = logging.getLogger(__name__)

#: What a `client` token may ask (each within its own tenant).
CLIENT_REQUESTS: Final[frozenset[type[Any]]] = frozenset(
    {
        Echo,
        Ping,
        ReMountSegment,  # registration; its segment list must be empty
        GetSegment,
        Stats,
        HaStatus,
        PutStart,
        UpsertStart,
        BatchPutStart,
        BatchUpsertStart,
        PutEnd,
        BatchPutEnd,
        PutRevoke,
        BatchPutRevoke,
        ReserveArena,
        ReleaseArenas,
        PutCommit,
        BatchPutCommit,
        GetReplicaList,
        BatchGetReplicaList,
        BatchGetLocations,
        ExistKey,
        BatchExistKey,
        GetSize,
        Remove,
        BatchRemove,
        ReportBadReplica,
        BatchReplicaClear,
        Subscribe,  # the invalidation stream of cached reads (its tenant is checked)
    }
)
#: What a `node` token may ask: a client's requests, plus mounting its segments and running
#: the replica tasks the master assigns to them.
NODE_REQUESTS: Final[frozenset[type[Any]]] = CLIENT_REQUESTS | {
    MountSegment,
    UnmountSegment,
    FetchTasks,
    MarkTaskComplete,
}
_ALLOWED: Final = {Role.CLIENT: CLIENT_REQUESTS, Role.NODE: NODE_REQUESTS}
_NO_CLIENT: Final = ClientId("")


def load_auth_file(path: str | Path) -> list[tuple[bytes, Principal]]:
    """The tokens of the auth file at `path` (InvalidParams naming the entry when it is
    malformed; tokens are never quoted in messages)."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidParams(f"auth file {path}: {exc}") from exc
    entries = doc.get("tokens") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InvalidParams(f"auth file {path}: expected a non-empty list under 'tokens:'")
    out: list[tuple[bytes, Principal]] = []
    roles = ", ".join(r.value for r in Role)
    for i, entry in enumerate(entries):
        where = f"auth file {path}, tokens[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"token", "tenant", "role"}:
            raise InvalidParams(f"{where}: expected {{token, tenant, role}}")
        token, tenant, role = entry.get("token"), entry.get("tenant"), entry.get("role")
        if not isinstance(token, str) or not token.strip():
            raise InvalidParams(f"{where}: 'token' must be a non-empty string")
        if not isinstance(tenant, str) or not tenant or len(tenant) > 256:
            raise InvalidParams(f"{where}: 'tenant' must be a non-empty string")
        try:
            parsed = Role(str(role))
        except ValueError:
            raise InvalidParams(f"{where}: 'role' must be one of {roles}, got {role!r}") from None
        out.append((token.strip().encode(), Principal(tenant, parsed)))
    return out


class Credentials:
    """The auth file of a master and the `TokenTable` it fills (reloaded by `reload`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.tokens = TokenTable(load_auth_file(self.path))

    def reload(self) -> bool:
        """Load the file again (SIGHUP); on any error keep the tokens in force and log it."""
        try:
            self.tokens.replace(load_auth_file(self.path))
        except KVPoolError as exc:
            log.error("auth file not reloaded, the previous tokens stay in force: %s", exc)
            return False
        log.info("auth file %s reloaded: %d tokens", self.path, len(self.tokens))
        return True

    def first_admin_token(self) -> bytes | None:
        """The token this master dials its HA leader with (the first admin token listed)."""
        return self.tokens.first(Role.ADMIN)


class RequestPolicy:
    """Who may ask what (module docstring). Stateless; runs on the master's loop."""

    def check(self, request: Any, principal: Principal | None) -> None:
        """Raise PermissionDenied (or Unauthenticated) unless `principal` may ask `request`."""
        if principal is None:  # only a server without credentials serves such a connection
            raise Unauthenticated("this connection proved no token")
        if principal.role is Role.ADMIN:
            return
        kind = type(request)
        if kind not in _ALLOWED[principal.role]:
            roles = " or ".join(
                [r.value for r, kinds in _ALLOWED.items() if kind in kinds] + ["admin"]
            )
            article = "an" if roles.startswith("admin") else "a"
            raise PermissionDenied(
                f"{kind.__name__} needs {article} {roles} token (this is a "
                f"{principal.role.value} token of tenant {principal.tenant!r})"
            )
        tenant = getattr(request, "tenant", None)
        if tenant is not None and tenant != principal.tenant:
            raise PermissionDenied(
                f"{kind.__name__} names tenant {tenant!r}; this token acts in tenant "
                f"{principal.tenant!r} only"
            )
        if kind is ReMountSegment and request.segments and principal.role is Role.CLIENT:
            raise PermissionDenied("mounting segments needs a node token, not a client token")

    @staticmethod
    def redact(reply: Any, principal: Principal | None) -> Any:
        """`reply` as `principal` may see it: client ids blanked for all but admins."""
        if principal is not None and principal.role is Role.ADMIN:
            return reply
        if isinstance(reply, StatsReply):
            return msgspec.structs.replace(
                reply,
                segments=[_no_owner(s) for s in reply.segments],
                clients=[_no_owner(c) for c in reply.clients],
                silent_segments=[_no_owner(s) for s in reply.silent_segments],
                silent_clients=[_no_owner(c) for c in reply.silent_clients],
                tenants=[
                    t for t in reply.tenants if principal is not None and t.name == principal.tenant
                ],
            )
        if isinstance(reply, SegmentReply) and reply.segment is not None:
            return msgspec.structs.replace(reply, segment=_no_owner(reply.segment))
        return reply

    def gate(self, inner: Callable[[Any, Connection], Any]) -> Callable[[Any, Connection], Any]:
        """`inner` behind `check`; Stats and GetSegment replies redacted."""
        check, redact = self.check, self.redact

        def handle(request: Any, conn: Connection) -> Any:
            principal = conn.principal
            check(request, principal)
            if isinstance(request, Stats | GetSegment):
                reply = inner(request, conn)
                if isinstance(reply, msgspec.Struct):
                    return redact(reply, principal)
                return _redacted(reply, principal)
            return inner(request, conn)

        return handle


def _no_owner(item: Any) -> Any:
    return msgspec.structs.replace(item, client_id=_NO_CLIENT)


async def _redacted(reply: Any, principal: Principal | None) -> Any:
    return RequestPolicy.redact(await reply, principal)
