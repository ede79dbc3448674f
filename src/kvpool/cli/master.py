"""`kvpool master`: run the metadata master of a pool until SIGINT / SIGTERM.

Flags carry Mooncake's master flag names (dashes for underscores) and defaults. Durations take
units ("10s", "500ms", "30min"; a bare number is seconds), sizes take "4GiB" forms. It binds
127.0.0.1 unless `--host` says otherwise, prints `kvpool master listening on HOST:PORT` once it
serves (the line tests and `kvpool up` wait for), and on SIGINT or SIGTERM closes every
connection and exits 0. Reclaim (`kvpool.master.reclaim`, plugged in through
`kvpool.master.hooks`) is on unless `--no-reclaim`.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path
from typing import Any

import click

from kvpool.cli.params import Name
from kvpool.cli.tiers import master_tier_options, tier_config
from kvpool.cli.tls import tls_config, tls_options
from kvpool.config import parse_duration, parse_size
from kvpool.errors import KVPoolError
from kvpool.ha import EtcdUrl
from kvpool.master.config import AllocationStrategy, EvictionMode, MasterConfig
from kvpool.master.ha import HaMasterServer
from kvpool.master.hooks import ReclaimHooks
from kvpool.master.quota import ETCD_SOURCE
from kvpool.master.reclaim.adapter import MasterReclaimHooks
from kvpool.master.server import MasterServer
from kvpool.ops.admin import MasterHttp, start_master_http
from kvpool.rpc.loop import run

__all__ = ["master"]


def _to_bytes(ctx: click.Context, param: click.Parameter, value: str) -> int:
    flag = f"--{(param.name or '').replace('_', '-')}"
    try:
        return parse_size(value, name=flag)
    except KVPoolError as exc:
        raise click.BadParameter(exc.message.removeprefix(f"{flag}: ")) from exc


def _to_seconds(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """Click callback: a duration flag ("10s", "500ms", a bare number of seconds) in seconds."""
    flag = f"--{(param.name or '').replace('_', '-')}"
    try:
        return parse_duration(value, name=flag)
    except KVPoolError as exc:
        raise click.BadParameter(exc.message.removeprefix(f"{flag}: ")) from exc


def _with_flag_names(message: str) -> str:
    """A `MasterConfig` message led by the flags whose fields it names."""
    fields = {p.name for p in master.params if p.name}
    named = [w for w in re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", message) if w in fields]
    flags = ", ".join(dict.fromkeys("--" + w.replace("_", "-") for w in named))
    return f"{flags}: {message}" if flags else message


def _ratio() -> click.FloatRange:
    return click.FloatRange(0.0, 1.0)


@click.command()
@click.option(
    "--host", default="127.0.0.1", show_default=True, type=Name(), help="Address to bind."
)
@click.option(
    "--port", default=50051, show_default=True, type=click.IntRange(0, 65535), help="RPC port."
)
@click.option(
    "--cluster-id",
    "--cluster_id",
    "cluster_id",
    default=None,
    type=Name(),
    help="Pool identity (also the HA cluster in etcd). [default: kvpool, or the one of --ha]",
)
@click.option(
    "--unix-socket/--no-unix-socket",
    default=True,
    show_default=True,
    help="Also listen on an abstract Unix socket, named in the handshake, so that clients on "
    "this host switch to it from TCP (a cheaper round trip); TCP serves everyone else.",
)
@click.option(
    "--default-kv-lease-ttl",
    default="10s",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="Read lease granted by every get / exist.",
)
@click.option(
    "--default-kv-soft-pin-ttl",
    default="30min",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="Soft pin of a put asking ENABLE without a TTL.",
)
@click.option(
    "--max-kv-soft-pin-ttl",
    default="24h",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="Largest soft-pin TTL a put may ask for.",
)
@click.option(
    "--allow-evict-soft-pinned-objects/--no-allow-evict-soft-pinned-objects",
    default=True,
    show_default=True,
    help="May reclaim evict soft-pinned objects as a last resort.",
)
@click.option(
    "--eviction-high-watermark-ratio",
    default=0.9,
    show_default=True,
    type=_ratio(),
    help="Used fraction above which background reclaim runs.",
)
@click.option(
    "--eviction-ratio",
    default=0.05,
    show_default=True,
    type=_ratio(),
    help="Fraction of objects one reclaim round aims to free.",
)
@click.option(
    "--eviction-mode",
    default="cache",
    show_default=True,
    type=click.Choice([m.value for m in EvictionMode]),
    help="cache: evicted objects are dropped; pool: they are moved, never lost.",
)
@click.option(
    "--client-ttl",
    default="10s",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="A client silent this long is silent: its segments take no new replicas and serve "
    "no reads until it pings again (dropped after --client-dead-ttl).",
)
@click.option(
    "--put-start-discard-timeout",
    default="30s",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="Age after which an unfinished put may be preempted by a new put of its key.",
)
@click.option(
    "--put-start-release-timeout",
    default="600s",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="Age after which the space of an unfinished put is released.",
)
@click.option(
    "--replica-task-timeout",
    default="300s",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="A replica copy/move task not reported within this fails (its destination is freed).",
)
@click.option(
    "--allocation-strategy",
    default="random",
    show_default=True,
    type=click.Choice([s.value for s in AllocationStrategy]),
    help="How segments are chosen for new replicas.",
)
@click.option(
    "--reclaim/--no-reclaim",
    default=True,
    show_default=True,
    help="Evict (seed 001 active/inactive lists, kswapd and direct reclaim) when memory runs "
    "short; with --no-reclaim a full pool answers NO_AVAILABLE_HANDLE.",
)
@click.option(
    "--num-shards",
    default=64,
    show_default=True,
    type=click.IntRange(1, 1 << 16),
    help="Metadata shards.",
)
@click.option(
    "--max-arena-size",
    default="64MiB",
    show_default=True,
    metavar="SIZE",
    callback=_to_bytes,
    help="Largest arena lent to a client for puts in one round trip (never above an eighth of "
    "the largest segment); 0 turns arenas off (every put takes PutStart and PutEnd).",
)
@click.option(
    "--alignment",
    default=64,
    show_default=True,
    type=click.IntRange(1, 1 << 30),
    help="Byte alignment of replicas in a segment (a power of two).",
)
# -- reliability (issue #13): silent clients, replica repair
@click.option(
    "--client-dead-ttl",
    default=None,
    metavar="DURATION",
    callback=lambda ctx, param, value: None if value is None else _to_seconds(ctx, param, value),
    help="A client silent this long is dropped: its segments unmounted, their objects "
    "repaired from other replicas (until then it is only silent: kept, neither read nor "
    "written). At least --client-ttl. [default: 3 x --client-ttl]",
)
@click.option(
    "--repair-max-in-flight",
    default=256,
    show_default=True,
    type=click.IntRange(0),
    help="Replica repair copies running at once at most; 0 turns repair off.",
)
# -- end reliability
# -- connection limits (issue #13, docs/parts/limits.md) --
@click.option(
    "--rpc-handshake-timeout",
    default="5s",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="A connection that has not completed its handshake within this is closed.",
)
@click.option(
    "--rpc-idle-timeout",
    default="300s",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="A connection that sent nothing for this long is closed (clients ping every second).",
)
@click.option(
    "--max-connections",
    default=16384,
    show_default=True,
    type=click.IntRange(1),
    help="Connections served at once (lowered to fit the file-descriptor limit); more are "
    "refused with UNAVAILABLE_IN_CURRENT_STATUS.",
)
@click.option(
    "--max-connections-per-peer",
    default=1024,
    show_default=True,
    type=click.IntRange(1),
    help="Connections served at once from one remote IP (Unix-socket clients count as one).",
)
@click.option(
    "--busy-poll-us",
    default=200,
    show_default=True,
    type=click.IntRange(0, 10_000),
    help="While requests arrive less than this many microseconds apart, poll for the next "
    "one instead of sleeping (saves each sender a wake-up; costs CPU during bursts); 0: off.",
)
# Durable metadata (docs/parts/ha.md, "Durable metadata").
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Keep an operation log and snapshots here; a master restarted on the same directory "
    "gets its objects back as their nodes remount (default: memory only).",
)
@click.option(
    "--fsync-interval",
    default="10ms",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="fdatasync the operation log this often (0: every record); a killed master loses "
    "nothing either way, a crashed machine at most this much.",
)
@click.option(
    "--snapshot-interval",
    default="60s",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="Write a snapshot (a forked child) and start a new log segment this often.",
)
# High availability (docs/parts/ha.md, "The master's HA").
@click.option(
    "--ha",
    "ha_url",
    default=None,
    metavar="etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID",
    help="Run as one master of an HA group: elect a leader through etcd; standbys keep a "
    "copy of the leader's metadata and take over when it dies.",
)
@click.option(
    "--advertise",
    default=None,
    metavar="HOST:PORT",
    help="Where other masters, nodes and clients reach this master (published in etcd). "
    "[default: the bound host:port]",
)
@click.option(
    "--member-id",
    default=None,
    metavar="ID",
    help="This master's name in its HA group. [default: from --advertise]",
)
@click.option(
    "--ha-lease-ttl",
    default=3,
    show_default=True,
    type=click.IntRange(2, 3600),
    help="Seconds of the leader's etcd lease: a dead leader is replaced about this long "
    "after its last keepalive.",
)
@click.option(
    "--ha-standby-timeout",
    default="2s",
    show_default=True,
    metavar="DURATION",
    callback=_to_seconds,
    help="A standby silent this long is no longer waited for: the leader acknowledges writes "
    "alone (and logs it) until a standby is in sync again.",
)
@click.option(
    "--ha-ack",
    type=click.Choice(["standby", "leader"]),
    default="standby",
    show_default=True,
    help="When the leader answers a write: 'standby' once a standby in sync has its records "
    "(an acknowledged write survives a failover), 'leader' at once (faster; a failover may "
    "lose the last moment's writes).",
)
# Mooncake's master flags for the same settings.
@click.option("--enable_ha", is_flag=True, help="Mooncake: run HA (with --etcd_endpoints).")
@click.option(
    "--etcd_endpoints",
    default=None,
    metavar="HOST:PORT[;HOST:PORT...]",
    help="Mooncake: etcd endpoints for --enable_ha (the cluster from --cluster_id).",
)
@click.option(
    "--ha_backend_connstring",
    default=None,
    metavar="ENDPOINTS",
    help="Mooncake: the same as --etcd_endpoints (an etcd:// URL is also accepted).",
)
@click.option(
    "--enable_snapshot",
    is_flag=True,
    help="Mooncake: keep snapshots and the operation log; needs --data-dir.",
)
@click.option(
    "--snapshot_interval_seconds",
    default=None,
    type=click.IntRange(1),
    help="Mooncake: --snapshot-interval in whole seconds.",
)
@click.option(
    "--http-port",
    "--metrics_port",
    "http_port",
    default=None,
    type=click.IntRange(0, 65535),
    help="Serve /metrics (Prometheus), the admin API and /dashboard over HTTP on this port of "
    "--host (0: a free port, logged as 'http listening on HOST:PORT'). Off by default; "
    "Mooncake's master uses 9003.",
)
@master_tier_options
@click.option(
    "--auth-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    help="YAML list of tokens (tokens: [{token, tenant, role: client|node|admin}]) every "
    "connection must prove; reloaded on SIGHUP. Without it every local process is trusted "
    "(docs/security.md).",
)
@click.option(
    "--tenant-quota-file",
    default=None,
    type=click.Path(dir_okay=False),
    metavar="PATH|etcd",
    help="Tenant quotas in Mooncake's format (version: 1, tenants: [{name, quota}]); a put "
    "past its tenant's quota fails TENANT_QUOTA_EXCEEDED. Reloaded on SIGHUP. 'etcd' (with "
    "--ha): the same YAML in the key /kvpool/<cluster>/quota, read every second.",
)
@tls_options
@click.option(
    "--enable_multi_tenants",
    is_flag=True,
    help="Mooncake: accepted (tenants are always on in kvpool); quotas need a connector.",
)
@click.option(
    "--tenant_quota_connector_type",
    type=click.Choice(["file"]),
    default=None,
    help="Mooncake: where the quota policy comes from (only 'file').",
)
@click.option(
    "--tenant_quota_connector_uri",
    default=None,
    metavar="PATH",
    help="Mooncake: the quota policy file (the same as --tenant-quota-file).",
)
def master(
    *,
    host: str,
    port: int,
    cluster_id: str | None,
    unix_socket: bool,
    default_kv_lease_ttl: float,
    default_kv_soft_pin_ttl: float,
    max_kv_soft_pin_ttl: float,
    allow_evict_soft_pinned_objects: bool,
    eviction_high_watermark_ratio: float,
    eviction_ratio: float,
    eviction_mode: str,
    client_ttl: float,
    put_start_discard_timeout: float,
    put_start_release_timeout: float,
    replica_task_timeout: float,
    allocation_strategy: str,
    reclaim: bool,
    num_shards: int,
    max_arena_size: int,
    alignment: int,
    client_dead_ttl: float | None,
    repair_max_in_flight: int,
    rpc_handshake_timeout: float,
    rpc_idle_timeout: float,
    max_connections: int,
    max_connections_per_peer: int,
    busy_poll_us: int,
    data_dir: str | None,
    fsync_interval: float,
    snapshot_interval: float,
    ha_url: str | None,
    advertise: str | None,
    member_id: str | None,
    ha_lease_ttl: int,
    ha_standby_timeout: float,
    ha_ack: str,
    enable_ha: bool,
    etcd_endpoints: str | None,
    ha_backend_connstring: str | None,
    enable_snapshot: bool,
    snapshot_interval_seconds: int | None,
    http_port: int | None,
    auth_file: str | None,
    tenant_quota_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    enable_multi_tenants: bool,
    tenant_quota_connector_type: str | None,
    tenant_quota_connector_uri: str | None,
    **tier_flags: Any,
) -> None:
    """Run the master on HOST:PORT until SIGINT or SIGTERM (SIGHUP reloads --auth-file)."""
    ha_url, cluster_id = _ha_url(
        ha_url, cluster_id, enable_ha, etcd_endpoints, ha_backend_connstring
    )
    if ha_url is not None and advertise is None and host in ("0.0.0.0", "::", ""):
        raise click.UsageError(
            f"--advertise: needed with --ha when binding {host!r} (the other masters, nodes "
            "and clients must be told an address they can reach)"
        )
    if enable_snapshot and data_dir is None:
        raise click.UsageError(
            "--enable_snapshot: needs --data-dir PATH (where the snapshots and the operation "
            "log are kept)"
        )
    if snapshot_interval_seconds is not None:
        snapshot_interval = float(snapshot_interval_seconds)
    tenant_quota_file = _quota_file(
        tenant_quota_file, tenant_quota_connector_type, tenant_quota_connector_uri
    )
    if tenant_quota_file == ETCD_SOURCE:
        if ha_url is None:
            raise click.UsageError("--tenant-quota-file etcd: needs --ha (the etcd to read)")
    elif tenant_quota_file is not None and not Path(tenant_quota_file).is_file():
        raise click.UsageError(f"--tenant-quota-file: {tenant_quota_file!r} is not a file")
    del enable_multi_tenants  # tenants are always on
    tls = tls_config(tls_cert, tls_key, tls_ca)
    if tls is not None and not tls.cert:
        raise click.UsageError("--tls-ca: a master with TLS needs --tls-cert and --tls-key")
    try:
        config = MasterConfig(
            host=host,
            port=port,
            unix_socket=unix_socket,
            cluster_id=cluster_id,
            default_kv_lease_ttl=default_kv_lease_ttl,
            default_kv_soft_pin_ttl=default_kv_soft_pin_ttl,
            max_kv_soft_pin_ttl=max_kv_soft_pin_ttl,
            allow_evict_soft_pinned_objects=allow_evict_soft_pinned_objects,
            eviction_high_watermark_ratio=eviction_high_watermark_ratio,
            eviction_ratio=eviction_ratio,
            eviction_mode=EvictionMode(eviction_mode),
            client_ttl=client_ttl,
            put_start_discard_timeout=put_start_discard_timeout,
            put_start_release_timeout=put_start_release_timeout,
            replica_task_timeout=replica_task_timeout,
            allocation_strategy=AllocationStrategy(allocation_strategy),
            num_shards=num_shards,
            max_arena_size=max_arena_size,
            alignment=alignment,
            client_dead_ttl=client_dead_ttl,
            repair_max_in_flight=repair_max_in_flight,
            rpc_handshake_timeout=rpc_handshake_timeout,
            rpc_idle_timeout=rpc_idle_timeout,
            rpc_max_connections=max_connections,
            rpc_max_connections_per_peer=max_connections_per_peer,
            rpc_busy_poll=busy_poll_us * 1e-6,
            data_dir=data_dir,
            fsync_interval=fsync_interval,
            snapshot_interval=snapshot_interval,
            ha_url=ha_url,
            advertise=advertise,
            member_id=member_id,
            ha_lease_ttl=ha_lease_ttl,
            ha_standby_timeout=ha_standby_timeout,
            ha_ack=ha_ack,
            tiers=tier_config(tier_flags),
            auth_file=auth_file or "",
            tenant_quota_file=tenant_quota_file or "",
            tls_cert=tls.cert if tls is not None else "",
            tls_key=tls.key if tls is not None else "",
            tls_ca=tls.ca if tls is not None else "",
        )
    except KVPoolError as exc:
        raise click.UsageError(_with_flag_names(exc.message)) from exc
    try:
        run(_serve(config, reclaim, http_port))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from exc
    except KVPoolError as exc:
        raise click.ClickException(exc.message) from exc


def _quota_file(path: str | None, connector: str | None, uri: str | None) -> str | None:
    """The tenant quota file from --tenant-quota-file or Mooncake's connector flags."""
    if uri is not None:
        if connector is None:
            raise click.UsageError(
                "--tenant_quota_connector_uri: needs --tenant_quota_connector_type=file"
            )
        if path is not None and path != uri:
            raise click.UsageError("--tenant_quota_connector_uri differs from --tenant-quota-file")
        return uri
    if connector is not None:
        raise click.UsageError("--tenant_quota_connector_type: needs --tenant_quota_connector_uri")
    return path


def _ha_url(
    ha_url: str | None,
    cluster_id: str | None,
    enable_ha: bool,
    etcd_endpoints: str | None,
    connstring: str | None,
) -> tuple[str | None, str]:
    """(the etcd:// URL or None, the cluster id) from --ha or Mooncake's flags."""
    if enable_ha and ha_url is None:
        given = etcd_endpoints or connstring
        if not given:
            raise click.UsageError("--enable_ha: needs --etcd_endpoints (or --ha)")
        if given.lower().startswith("etcd://"):
            ha_url = given
        else:
            ha_url = f"etcd://{given.strip()}/{cluster_id or 'kvpool'}"
    elif (etcd_endpoints or connstring) and ha_url is None:
        raise click.UsageError("--etcd_endpoints / --ha_backend_connstring: need --enable_ha")
    if ha_url is None:
        return None, cluster_id or "kvpool"
    try:
        url = EtcdUrl.parse(ha_url)
    except KVPoolError as exc:
        raise click.BadParameter(exc.message, param_hint="--ha") from exc
    if cluster_id is not None and cluster_id != url.cluster_id:
        raise click.UsageError(
            f"--cluster-id {cluster_id!r} differs from the cluster id of --ha ({url.cluster_id!r})"
        )
    return str(url), url.cluster_id


async def _serve(config: MasterConfig, reclaim: bool, http_port: int | None = None) -> None:
    def hooks() -> ReclaimHooks | None:
        return MasterReclaimHooks() if reclaim else None

    server: MasterServer
    if config.ha_url is not None:
        server = HaMasterServer(config, hooks_factory=hooks)
    else:
        server = MasterServer(config, hooks=hooks())
    http: MasterHttp | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    credentials, quotas = server.credentials, server.quotas

    def reload() -> None:
        if credentials is not None:
            credentials.reload()
        if quotas is not None:
            quotas.reload()

    if credentials is not None or quotas is not None:
        loop.add_signal_handler(signal.SIGHUP, reload)
    try:
        await server.start()
        host, port = server.address
        if isinstance(server, HaMasterServer):
            click.echo(
                f"kvpool master: HA member {server.member_id} advertising {server.advertise}"
            )
        if http_port is not None:
            http = await start_master_http(server, config.host, http_port)
        if credentials is not None:
            click.echo(f"kvpool master: {len(credentials.tokens)} tokens from {credentials.path}")
        else:
            click.echo("kvpool master: no --auth-file: every process that reaches it is trusted")
        click.echo(f"kvpool master listening on {host}:{port}")
        if http is not None:
            # After the RPC line: `children.READY_RE` waits for the first "listening on".
            h, p = http.address
            click.echo(f"kvpool master: http listening on {h}:{p}")
        sys.stdout.flush()
        await stop.wait()
        click.echo("kvpool master: stopping")
    finally:
        if http is not None:
            await http.close()
        await server.close()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
