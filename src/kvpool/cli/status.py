"""`kvpool status`: ask a master for its Stats and print them as tables (or JSON).

One Stats request: segments (capacity, used, objects), registered clients (segments, in-flight
puts, time left before expiry), the object count, silent segments and clients (kept while their
owner may come back; docs/parts/reliability.md) and replica repair (objects under-replicated,
copies queued, running, done, failed). `--json` prints one JSON object with the
same fields (named, not positional), for scripts.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
import msgspec

from kvpool.cli.params import Duration, MasterAddress, Name
from kvpool.cli.tls import tls_config, tls_options
from kvpool.client.leader import LeaderFollower, check_master, parse_master
from kvpool.config import format_size
from kvpool.errors import KVPoolError
from kvpool.protocol.messages import HaStatus, HaStatusReply, Response, Stats, StatsReply
from kvpool.rpc.auth import client_token
from kvpool.rpc.client import RpcClient
from kvpool.rpc.tls import TlsConfig

__all__ = ["render_table", "stats_to_dict", "status"]


def stats_to_dict(reply: StatsReply) -> dict[str, Any]:
    """The reply as plain named fields (the wire form is positional)."""

    def named(obj: msgspec.Struct) -> dict[str, Any]:
        return {f: getattr(obj, f) for f in obj.__struct_fields__}

    out = named(reply)
    out["segments"] = [named(s) for s in reply.segments]
    out["clients"] = [named(c) for c in reply.clients]
    out["silent_segments"] = [named(s) for s in reply.silent_segments]
    out["silent_clients"] = [named(c) for c in reply.silent_clients]
    out["tenants"] = [named(t) for t in reply.tenants]
    return out


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def render_table(address: str, reply: StatsReply) -> str:
    """The human form: a summary line, then a segments table and a clients table."""
    lines = [
        f"master {address}: up {reply.uptime_s:.0f} s, {reply.objects} objects "
        f"({reply.processing} being written), {format_size(reply.used)} of "
        f"{format_size(reply.capacity)} used ({_pct(reply.used, reply.capacity)}; "
        f"{reply.arenas} arenas hold {format_size(reply.arena_bytes)} of it for puts), "
        f"{reply.tasks_active} replica tasks running",
        f"repair: {reply.under_replicated} objects under-replicated, "
        f"{reply.repair_queued} queued, {reply.repair_in_flight} copying, "
        f"{reply.repair_done} done, {reply.repair_failed} failed",
        "",
    ]
    seg_rows = [
        [
            s.name,
            s.client_id,
            s.host_id,
            s.endpoint,
            format_size(s.capacity),
            format_size(s.used),
            _pct(s.used, s.capacity),
            str(s.objects),
        ]
        for s in sorted(reply.segments, key=lambda s: s.name)
    ]
    lines.append(f"segments: {len(seg_rows)}")
    if seg_rows:
        lines += _table(
            ["SEGMENT", "CLIENT", "HOST", "ENDPOINT", "CAPACITY", "USED", "USE%", "OBJECTS"],
            seg_rows,
            right={4, 5, 6, 7},
        )
    if reply.silent_segments:
        n = len(reply.silent_segments)
        lines += ["", f"silent segments (kept until their owner is back or dropped): {n}"]
        lines += _table(
            ["SEGMENT", "CLIENT", "HOST", "CAPACITY", "USED", "OBJECTS"],
            [
                [
                    s.name,
                    s.client_id,
                    s.host_id,
                    format_size(s.capacity),
                    format_size(s.used),
                    str(s.objects),
                ]
                for s in sorted(reply.silent_segments, key=lambda s: s.name)
            ],
            right={3, 4, 5},
        )
    client_rows = [
        [c.client_id, c.host_id, str(c.segments), str(c.in_flight_puts), f"{c.ttl_left_s:.1f} s"]
        for c in sorted(reply.clients, key=lambda c: c.client_id)
    ]
    lines += ["", f"clients: {len(client_rows)}"]
    if client_rows:
        lines += _table(
            ["CLIENT", "HOST", "SEGMENTS", "IN-FLIGHT", "TTL LEFT"], client_rows, right={2, 3, 4}
        )
    if reply.silent_clients:
        lines += ["", f"silent clients: {len(reply.silent_clients)}"]
        lines += _table(
            ["CLIENT", "HOST", "SEGMENTS", "DROPPED IN"],
            [
                [c.client_id, c.host_id, str(c.segments), f"{c.ttl_left_s:.1f} s"]
                for c in sorted(reply.silent_clients, key=lambda c: c.client_id)
            ],
            right={2, 3},
        )
    if reply.tenants:
        lines += ["", f"tenants: {len(reply.tenants)}"]
        lines += _table(
            ["TENANT", "USED", "QUOTA", "USE%"],
            [
                [
                    t.name,
                    format_size(t.used),
                    "-" if t.quota is None else format_size(t.quota),
                    "-" if t.quota is None else _pct(t.used, t.quota),
                ]
                for t in reply.tenants
            ],
            right={1, 2, 3},
        )
    return "\n".join(lines)


@click.command()
@click.option(
    "--master",
    "address",
    default="127.0.0.1:50051",
    show_default=True,
    type=MasterAddress(),
    help="HOST:PORT of the master, or etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID to ask the "
    "current leader of a highly available cluster.",
)
@click.option("--cluster-id", default="kvpool", show_default=True, type=Name())
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=Duration(0.1, 3600),
    help="Seconds to wait for the master.",
)
@click.option(
    "--watch", is_flag=True, help="Refresh every --interval until Ctrl-C (tables or JSON)."
)
@click.option(
    "--interval",
    default=2.0,
    show_default=True,
    type=Duration(0.1, 3600),
    help="Seconds between refreshes with --watch.",
)
@click.option(
    "--token-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    help="File whose first line is the token to prove to a master with --auth-file "
    "[default: $KVPOOL_AUTH_TOKEN].",
)
@tls_options
def status(
    *,
    address: str,
    cluster_id: str,
    as_json: bool,
    timeout: float,
    watch: bool = False,
    interval: float = 2.0,
    token_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
) -> None:
    """Show the segments, clients and objects of the pool whose master is at --master."""
    tls = tls_config(tls_cert, tls_key, tls_ca)
    if not watch:
        _show(address, cluster_id, as_json, timeout, token_file, tls=tls)
        return
    try:
        while True:
            if not as_json:
                click.clear()
                click.echo(f"{time.strftime('%H:%M:%S')}  every {interval:g}s (Ctrl-C stops)")
            try:
                _show(address, cluster_id, as_json, timeout, token_file, tls=tls)
            except click.ClickException as exc:  # the master may come back: keep watching
                click.echo(f"error: {exc.message}", err=True)
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def _show(
    address: str,
    cluster_id: str,
    as_json: bool,
    timeout: float,
    token_file: str | None,
    *,
    tls: TlsConfig | None = None,
) -> None:
    master = address
    try:
        url = parse_master(master)
        cluster_id = check_master(master, cluster_id)
        if url is not None:
            follower = LeaderFollower(url)
            try:
                view = follower.leader(timeout)
            finally:
                follower.close()
            address = view.address
            if not as_json:
                click.echo(f"leader of {url}: {view.member_id} at {view.address}, term {view.term}")
        with RpcClient(
            address,
            response_type=Response,
            cluster_id=cluster_id,
            timeout=timeout,
            client_name="kvpool-status",
            token=client_token(None, token_file),
            tls=tls.client_context() if tls is not None else None,
        ) as rpc:
            reply = rpc.call_as(Stats(), StatsReply)
            ha = rpc.call_as(HaStatus(), HaStatusReply)
    except KVPoolError as exc:
        raise click.ClickException(f"cannot get the status of {master}: {exc}") from exc
    if reply.code != 0:
        raise click.ClickException(f"master {address} answered code {reply.code}")
    if as_json:
        out = stats_to_dict(reply)
        out["ha"] = msgspec.to_builtins(ha)
        click.echo(json.dumps(out, indent=2))
    else:
        if ha.role != "single":
            standbys = ", ".join(ha.standbys) or "none (the leader acknowledges alone)"
            click.echo(
                f"role {ha.role} ({ha.member_id}), term {ha.term}, standbys in sync: {standbys}"
            )
        click.echo(render_table(address, reply))
