"""`kvpool up`: the embedded default, a master and one storage node on this machine.

It prints the address to connect to (`Store(master="HOST:PORT")`, also as the usual
`listening on HOST:PORT` line) and then one live status line (segments, clients, objects, memory
used), redrawn in place on a terminal. Ctrl-C (or SIGTERM) stops the node, which unmounts and
frees its segment, then the master: nothing is left behind.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from types import FrameType

import click

from kvpool.cli.params import Duration, Name, Size
from kvpool.cli.status import render_table
from kvpool.cli.tiers import DiskCheck, node_tier_options
from kvpool.cli.tls import tls_config, tls_options
from kvpool.client.embedded import EmbeddedPool, PoolSpec
from kvpool.client.node import MIN_SEGMENT_SIZE
from kvpool.client.validation import check_segment_size
from kvpool.config import format_size
from kvpool.errors import KVPoolError
from kvpool.protocol.messages import Response, Stats, StatsReply
from kvpool.rpc.auth import client_token
from kvpool.rpc.client import RpcClient
from kvpool.rpc.tls import TlsConfig

__all__ = ["status_line", "up"]


def status_line(address: str, reply: StatsReply) -> str:
    """One line summing up a pool (what `kvpool up` keeps redrawing): the summary line of
    `kvpool status`, plus how many segments, hosts and clients there are."""
    summary = render_table(address, reply).splitlines()[0]
    hosts = {s.host_id for s in reply.segments}
    return (
        f"{summary} | {len(reply.segments)} segment(s) on {len(hosts)} host(s), "
        f"{len(reply.clients)} client(s)"
    )


@click.command()
@click.option(
    "--segment-size",
    default="1GiB",
    show_default=True,
    type=Size(minimum=MIN_SEGMENT_SIZE),
    help="Memory of the node.",
)
@click.option(
    "--port",
    default=50051,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Master port (0: any free one).",
)
@click.option(
    "--host", default="127.0.0.1", show_default=True, type=Name(), help="Address to bind."
)
@click.option(
    "--client-ttl",
    default=None,
    type=Duration(minimum=0.1),
    help="Expire silent clients after this (e.g. 10s).",
)
@click.option(
    "--refresh",
    default="1s",
    show_default=True,
    type=Duration(0.05, 3600),
    help="Status line refresh period.",
)
@node_tier_options
@click.option(
    "--auth-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    help="The master's tokens (as `kvpool master --auth-file`); the node and the status line "
    "prove the token of --token-file.",
)
@click.option(
    "--token-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    help="File whose first line is the token (a node or admin one) the node and the status "
    "line prove [default: $KVPOOL_AUTH_TOKEN].",
)
@tls_options
def up(
    *,
    segment_size: int,
    port: int,
    host: str,
    client_ttl: float | None,
    refresh: float,
    offload_dir: tuple[str, ...],
    offload_size: int,
    dfs_root: str | None = None,
    disk_check_interval: float | None = None,
    disk_check_per_round: int | None = None,
    disk_check_bytes_per_round: int | None = None,
    auth_file: str | None = None,
    token_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
) -> None:
    """Run a master and one node here until Ctrl-C."""
    # -- credentials and TLS: the master's files, the token and files its children prove
    token = client_token(None, token_file)
    if auth_file is not None and token is None:
        raise click.UsageError(
            "--auth-file: the node needs a token too (--token-file or $KVPOOL_AUTH_TOKEN)"
        )
    tls = tls_config(tls_cert, tls_key, tls_ca)
    if tls is not None and not (tls.cert and tls.ca):
        raise click.UsageError("TLS: kvpool up needs --tls-cert, --tls-key and --tls-ca")
    secure: tuple[str, ...] = ()
    if tls is not None:
        secure = ("--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca)
    auth_master = ("--auth-file", auth_file) if auth_file is not None else ()
    auth_node = ("--token-file", token_file) if token_file is not None else ()
    try:
        size = check_segment_size(segment_size, "--segment-size")
    except KVPoolError as exc:
        raise click.BadParameter(
            exc.message.removeprefix("--segment-size: "), param_hint="'--segment-size'"
        ) from exc
    check = DiskCheck(  # tiers: the disk tier's background check, passed on to the node
        disk_check_interval, disk_check_per_round, disk_check_bytes_per_round
    ).given(offload_dir)
    period = refresh
    ttl = client_ttl
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    node_args: tuple[str, ...] = ()
    master_args: tuple[str, ...] = ()
    if offload_dir:
        # A disk tier: what reclaim takes out of memory moves there (docs/parts/tiers.md).
        dirs = tuple(a for d in offload_dir for a in ("--offload-dir", d))
        node_args = (*dirs, "--offload-size", str(offload_size))
        node_args += check.argv()
        master_args = ("--offload-policy", "on-evict")
    master_args += auth_master + secure
    node_args += auth_node + secure
    if dfs_root is not None:  # a DFS tier: the master's directory, the node at the same path
        node_args = (*node_args, "--dfs-root", dfs_root)
        master_args = (*master_args, "--dfs-root", dfs_root)
    pool = EmbeddedPool(
        PoolSpec(
            segment_size=size,
            host=host,
            port=port,
            client_ttl=ttl,
            master_args=master_args,
            node_args=node_args,
        )
    )
    try:
        try:
            click.echo(f"starting a master and a node with {format_size(size)} ...")
            address = pool.start()
        except KVPoolError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f'kvpool is up: connect with kvpool.Store(master="{address}")')
        click.echo(f"listening on {address}")
        healthy = _watch(pool, address, period, stop, token=token, tls=tls)
    finally:
        pool.close()
    if not healthy:
        raise click.ClickException("one of the pool's processes exited; everything is stopped")
    click.echo("\nkvpool up: stopped (node unmounted, master gone)")


def _without_uptime(line: str) -> str:
    return re.sub(r"up \d+ s", "", line)


def _watch(
    pool: EmbeddedPool,
    address: str,
    period: float,
    stop: threading.Event,
    *,
    token: bytes | None = None,
    tls: TlsConfig | None = None,
) -> bool:
    """Redraw the status line until `stop`; False when a process of the pool died."""
    tty = sys.stdout.isatty()
    last = ""
    with RpcClient(
        address,
        response_type=Response,
        timeout=max(period, 2.0),
        token=token,
        tls=tls.client_context() if tls is not None else None,
    ) as rpc:
        while not stop.wait(period):
            if not pool.alive():
                return False
            try:
                line = status_line(address, rpc.call_as(Stats(), StatsReply))
            except KVPoolError as exc:
                line = f"master not answering: {exc}"
            if tty:
                click.echo("\r" + line.ljust(len(last)), nl=False)
            elif _without_uptime(line) != _without_uptime(last):
                click.echo(line)  # in a log, only when something changed
            last = line
    return True
