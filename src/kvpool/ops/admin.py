"""The master's admin HTTP API (JSON) and `/metrics`, served on the master's own loop.

    GET  /metrics                   Prometheus text (`metrics.MasterCollector`)
    GET  /dashboard (and /)         the live dashboard (`dashboard.py`)
    GET  /health                    {"status": "ok", ...}
    GET  /role                      leader / standby / lost-lead / single, term, leader address
    GET  /query_key?key=&tenant=    the object: size, replicas, lease, pins
    GET  /get_all_segments          names of the mounted segments (Mooncake's path)
    GET  /api/v1/segments/status    every mounted segment: capacity, used, objects, state, owner
    GET  /get_all_keys?tenant=&limit=&after=
                                    keys, a page at a time (`next` is the `after` of the next)
    GET  /api/v1/tenants            objects and bytes per tenant (walked in steps)
    GET  /api/v1/stats              the pool in one object (what `kvpool status` shows)
    POST /api/v1/segments/drain?segment=&grace=
                                    start a graceful drain (`kvpool.master.drain`)
    GET  /api/v1/segments/drain?segment=
                                    its progress

With credentials (`kvpool master --auth-file`, docs/security.md) every path but `/metrics`,
`/health`, `/role` and the dashboard page itself needs `Authorization: Bearer TOKEN` naming an
`admin` token of the auth file: no token (or an unknown one) answers 401, a client or node
token 403. The open paths reveal no key, client id or tenant, so Prometheus scrapes and
liveness probes keep working without a secret; they do name segments, and a segment's name is
its node's transfer endpoint and a number (`/role` names the HA leader's address), which gives
nothing without a token: a transfer server with credentials serves only connections that prove
the pool's data key (docs/security.md). The dashboard page carries no data; it sends the token
(typed into it, or given as `#token=...` in its URL, never sent in a query string) with each
request it makes. The HTTP port speaks HTTPS when the master has `--tls-cert`; without it, serve
it on loopback (the default) or behind a TLS proxy, or the token crosses the network in clear
text. Without credentials everything is
open, as before.

Every handler reads the metadata on the loop that owns it; walks over all objects yield to the
loop every `_STEP_SHARDS` shards, so a scrape or a page never stalls the RPC requests. Bad
parameters answer 400 with `{"error": ...}`; an unknown key 404.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from itertools import islice
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from kvpool.codes import SEGMENT_NOT_FOUND
from kvpool.config import parse_duration
from kvpool.errors import KVPoolError
from kvpool.ops.dashboard import DASHBOARD_HTML
from kvpool.ops.http import (
    Handler,
    HttpError,
    HttpRequest,
    HttpServer,
    Response,
    json_response,
)
from kvpool.ops.metrics import MasterCollector, RequestCounters, op_name, reclaim_stats
from kvpool.protocol.drain import DrainReply, DrainSegment, DrainStatus
from kvpool.protocol.messages import (
    DEFAULT_TENANT,
    SegmentName,
    Stats,
)

if TYPE_CHECKING:
    from kvpool.master.metadata import ObjectMeta
    from kvpool.master.server import MasterServer
    from kvpool.rpc.auth import TokenTable

__all__ = ["MasterHttp", "start_master_http"]

_DASHBOARD = DASHBOARD_HTML.encode()
_STEP_SHARDS = 64
_MAX_PAGE = 10_000
_MAX_KEY = 4096


class MasterHttp:
    """The admin API and metrics of one `MasterServer` on an `HttpServer` it owns."""

    def __init__(self, server: MasterServer, host: str, port: int) -> None:
        self.server = server
        self.counters = RequestCounters()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(MasterCollector(server, self.counters))
        tls = server.tls  # the RPC listener's --tls-*: the HTTP port speaks HTTPS too
        self.http = HttpServer(host, port, tls.server_context() if tls is not None else None)
        creds = server.credentials
        self._tokens: TokenTable | None = None if creds is None else creds.tokens
        for path, handler in (
            ("/metrics", self.metrics),
            ("/health", self.health),
            ("/role", self.role),
        ):
            self.http.route("GET", path, handler)
        gated: tuple[tuple[str, Handler], ...] = (
            ("/query_key", self.query_key),
            ("/get_all_segments", self.all_segments),
            ("/api/v1/segments/status", self.segments_status),
            ("/get_all_keys", self.all_keys),
            ("/api/v1/tenants", self.tenants),
            ("/api/v1/stats", self.stats),
            ("/api/v1/segments/drain", self.drain_status),
        )
        for path, admin_handler in gated:
            self.http.route("GET", path, self._admin(admin_handler))
        self.http.route("GET", "/dashboard", self.dashboard)
        self.http.route("GET", "/", self.dashboard)
        self.http.route("POST", "/api/v1/segments/drain", self._admin(self.drain))

    def _admin(self, handler: Handler) -> Handler:
        """`handler` for admin tokens only, when the master has credentials (module
        docstring); without credentials `handler` itself."""
        tokens = self._tokens
        if tokens is None:
            return handler

        def admin_only(req: HttpRequest) -> Response | Awaitable[Response]:
            scheme, _, token = req.headers.get("authorization", "").partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise HttpError(
                    401,
                    "this master has credentials: send 'Authorization: Bearer TOKEN' "
                    "with an admin token",
                    {"WWW-Authenticate": 'Bearer realm="kvpool"'},
                )
            principal = tokens.principal_of(token.encode())
            if principal is None:
                raise HttpError(
                    401, "unknown token", {"WWW-Authenticate": 'Bearer error="invalid_token"'}
                )
            if not principal.admin:
                raise HttpError(
                    403, f"{req.path} needs an admin token (this is a {principal.role.value} token)"
                )
            return handler(req)

        return admin_only

    @property
    def address(self) -> tuple[str, int]:
        return self.http.address

    async def start(self) -> None:
        """Count the master's requests from now on and serve HTTP."""
        self.server.wrap_handler(self.counters.wrap)
        await self.http.start()

    async def close(self) -> None:
        await self.http.close()

    # ------------------------------------------------------------------ endpoints

    def metrics(self, req: HttpRequest) -> Response:
        return Response(generate_latest(self.registry), CONTENT_TYPE_LATEST)

    def dashboard(self, req: HttpRequest) -> Response:
        return Response(_DASHBOARD, "text/html; charset=utf-8")

    def health(self, req: HttpRequest) -> Response:
        svc = self.server.service
        return json_response(
            {"status": "ok", "objects": len(svc.index), "segments": len(svc.segments)}
        )

    def role(self, req: HttpRequest) -> Response:
        st = self.server.ha_status()
        return json_response(
            {
                "role": st.role,
                "member_id": st.member_id,
                "term": st.term,
                "leader": st.leader,
                "leader_term": st.leader_term,
                "position": st.position,
                "standbys": list(st.standbys),
                "objects": st.objects,
            }
        )

    def query_key(self, req: HttpRequest) -> Response:
        key = req.required("key")
        if len(key) > _MAX_KEY:
            raise HttpError(400, f"key: longer than {_MAX_KEY} characters")
        tenant = req.param("tenant") or DEFAULT_TENANT
        svc = self.server.service
        obj = svc.index.get(tenant, key)
        if obj is None:
            raise HttpError(404, f"no object {key!r} in tenant {tenant!r}")
        return json_response(_describe(obj, svc.now()))

    def all_segments(self, req: HttpRequest) -> Response:
        return json_response({"segments": [s.name for s in self.server.service.segments.mounted()]})

    def segments_status(self, req: HttpRequest) -> Response:
        return json_response(
            {"segments": [_segment(s) for s in self.server.service.segments.mounted()]}
        )

    def stats(self, req: HttpRequest) -> Response:
        st = self.server.service.stats(Stats())
        return json_response(
            {
                "objects": st.objects,
                "capacity": st.capacity,
                "used": st.used,
                "processing": st.processing,
                "uptime_s": st.uptime_s,
                "tasks_active": st.tasks_active,
                "arenas": st.arenas,
                "arena_bytes": st.arena_bytes,
                "under_replicated": st.under_replicated,
                "clients": [
                    {
                        "client_id": c.client_id,
                        "host_id": c.host_id,
                        "segments": c.segments,
                        "ttl_left_s": c.ttl_left_s,
                        "in_flight_puts": c.in_flight_puts,
                        "silent": c.silent,
                    }
                    for c in (*st.clients, *st.silent_clients)
                ],
                "segments": [_segment(s) for s in self.server.service.segments.mounted()],
                "requests": {op_name(k): c.requests for k, c in self.counters.kinds.items()},
                "failures": {op_name(k): c.failures for k, c in self.counters.kinds.items()},
                "reclaim": reclaim_stats(self.server.service.hooks),
                "role": self.server.ha_status().role,
            }
        )

    def all_keys(self, req: HttpRequest) -> Response:
        tenant = req.param("tenant") or DEFAULT_TENANT
        limit = req.int_param("limit", 1000, 1, _MAX_PAGE)
        shard, skip = _cursor(req.param("after"))
        index = self.server.service.index
        t = index.tenant(tenant)
        keys: list[str] = []
        nxt: str | None = None
        if t is not None:
            shards = t.shards
            if shard >= len(shards):
                raise HttpError(400, f"after: shard {shard} beyond the {len(shards)} shards")
            while shard < len(shards):
                want = limit - len(keys)
                got = list(islice(shards[shard], skip, skip + want))
                keys.extend(got)
                if len(got) == want:
                    skip += want
                    if skip < len(shards[shard]) or shard + 1 < len(shards):
                        nxt = f"{shard}.{skip}"
                    break
                shard, skip = shard + 1, 0
        return json_response({"tenant": tenant, "keys": keys, "next": nxt})

    async def tenants(self, req: HttpRequest) -> Response:
        index = self.server.service.index
        out: list[dict[str, Any]] = []
        steps = 0
        for name in index.tenants():
            t = index.tenant(name)
            if t is None:
                continue
            objects = size = replica_bytes = 0
            for shard in t.shards:
                for obj in list(shard.values()):
                    objects += 1
                    size += obj.size
                    replica_bytes += obj.size * len(obj.replicas)
                steps += 1
                if steps % _STEP_SHARDS == 0:
                    await asyncio.sleep(0)
            out.append(
                {"tenant": name, "objects": objects, "bytes": size, "replica_bytes": replica_bytes}
            )
        out.sort(key=lambda d: -d["replica_bytes"])
        return json_response({"tenants": out})

    def drain(self, req: HttpRequest) -> Response:
        name = req.required("segment")
        role = self.server.ha_status().role
        if role not in ("single", "leader"):
            raise HttpError(409, f"this master is a {role}: ask the leader to drain")
        raw = req.param("grace") or "30s"
        try:
            grace = parse_duration(raw, name="grace", maximum=24 * 3600.0)
        except KVPoolError as exc:
            raise HttpError(400, exc.message) from None
        reply = self.server.service.drains.drain_segment(
            DrainSegment(SegmentName(name), int(grace * 1000))
        )
        if reply.code == SEGMENT_NOT_FOUND:
            raise HttpError(404, f"segment: no mounted segment {name!r}")
        return json_response(_drain(name, reply))

    def drain_status(self, req: HttpRequest) -> Response:
        name = req.required("segment")
        reply = self.server.service.drains.drain_status(DrainStatus(SegmentName(name)))
        if reply.code != 0:
            raise HttpError(404, f"segment: no drain of {name!r} is known")
        return json_response(_drain(name, reply))


async def start_master_http(server: MasterServer, host: str, port: int) -> MasterHttp:
    """Metrics and the admin API of `server` on HOST:PORT (0: a free port), started."""
    http = MasterHttp(server, host, port)
    await http.start()
    return http


def _drain(name: str, reply: DrainReply) -> dict[str, Any]:
    out = {f: getattr(reply, f) for f in reply.__struct_fields__ if f != "code"}
    out["segment"] = name
    return out


def _cursor(after: str | None) -> tuple[int, int]:
    if after is None or after == "":
        return 0, 0
    shard, sep, skip = after.partition(".")
    if not sep or not shard.isdigit() or not skip.isdigit():
        raise HttpError(400, f"after: {after!r} is not a cursor this server returned (SHARD.N)")
    return int(shard), int(skip)


def _segment(seg: Any) -> dict[str, Any]:
    a = seg.allocator
    state = (
        "draining" if getattr(seg, "draining", False) else ("serving" if seg.serving else "silent")
    )
    return {
        "name": seg.name,
        "client_id": seg.client_id,
        "host_id": seg.host_id,
        "endpoint": seg.endpoint,
        "capacity": a.capacity,
        "used": a.allocated,
        "free": a.capacity - a.allocated,
        "objects": seg.objects,
        "state": state,
    }


def _describe(obj: ObjectMeta, now: float) -> dict[str, Any]:
    soft = obj.soft_pin_deadline
    return {
        "key": obj.key,
        "tenant": obj.tenant,
        "size": obj.size,
        "complete": obj.complete,
        "replica_num": obj.replica_num,
        "hard_pin": obj.hard_pin,
        "soft_pin_ttl": obj.soft_pin_ttl,
        "soft_pin_left_s": None if soft is None else max(0.0, soft - now),
        "lease_left_s": max(0.0, obj.lease_deadline - now),
        "checksum": obj.checksum,
        "replicas": [
            {
                "segment": r.segment.name,
                "offset": r.offset,
                "status": r.status.name,
                "kind": r.kind.name,
                "alive": r.segment.alive,
                "tier": r.kind.name.lower(),
            }
            for r in obj.replicas
        ],
    }
