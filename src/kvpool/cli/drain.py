"""`kvpool drain`: gracefully unmount one segment of a pool, with a progress bar.

Sends `DrainSegment` to the master (it stops placing anything on the segment at once, moves out
what must not be lost, waits for read leases up to the grace, then unmounts; see
`kvpool.master.drain`), then polls `DrainStatus` every 0.2 s and draws the moves as a progress
bar until the drain ends. Exits 0 when the segment was unmounted with nothing that had to be
kept lost, 1 when moves failed (the numbers are printed), 2 on a usage error.
"""

from __future__ import annotations

import sys
import time

import click

from kvpool.cli.params import Duration, MasterAddress, Name
from kvpool.cli.tls import tls_config, tls_options
from kvpool.codes import SEGMENT_NOT_FOUND
from kvpool.errors import KVPoolError
from kvpool.protocol.drain import DrainReply, DrainSegment, DrainStatus
from kvpool.protocol.messages import (
    Response,
    SegmentName,
)
from kvpool.rpc.auth import client_token
from kvpool.rpc.client import RpcClient

__all__ = ["drain", "format_progress"]

_ENDED = ("done", "aborted")


def format_progress(name: str, r: DrainReply, width: int = 30) -> str:
    """One line: state, a bar of moves done over objects to keep, leases, elapsed time."""
    todo = max(r.must_keep, 1)
    done = r.moved + r.failed
    filled = min(width, width * done // todo) if r.must_keep else width
    bar = "#" * filled + "." * (width - filled)
    return (
        f"{name} [{bar}] {r.state:<14} moved {r.moved}/{r.must_keep} of {r.objects} objects, "
        f"failed {r.failed}, leased {r.leased}, {r.elapsed_s:.1f}/{r.grace_s:.0f}s"
    )


@click.command()
@click.option(
    "--master",
    "address",
    default="127.0.0.1:50051",
    show_default=True,
    type=MasterAddress(),
    help="HOST:PORT of the master.",
)
@click.option("--segment", required=True, help="Name of the segment to drain.")
@click.option(
    "--grace",
    default=30.0,
    show_default=True,
    type=Duration(0, 24 * 3600),
    help="How long moves and read leases may take before the segment is unmounted anyway.",
)
@click.option("--cluster-id", default="kvpool", show_default=True, type=Name())
@click.option("--no-wait", is_flag=True, help="Start the drain and return at once.")
@click.option(
    "--token-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    help="File whose first line is the (admin) token to prove to a master with --auth-file "
    "[default: $KVPOOL_AUTH_TOKEN].",
)
@tls_options
def drain(
    *,
    address: str,
    segment: str,
    grace: float,
    cluster_id: str,
    no_wait: bool,
    token_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
) -> None:
    """Drain SEGMENT: no new replicas, move pinned objects out, wait for leases, unmount."""
    name = SegmentName(segment)
    tls = tls_config(tls_cert, tls_key, tls_ca)
    try:
        with RpcClient(
            address,
            response_type=Response,
            cluster_id=cluster_id,
            timeout=10.0,
            client_name="kvpool-drain",
            token=client_token(None, token_file),
            tls=tls.client_context() if tls is not None else None,
        ) as rpc:
            reply = rpc.call_as(DrainSegment(name, int(grace * 1000)), DrainReply)
            if reply.code == SEGMENT_NOT_FOUND:
                # Unmounted already: by a drain that just ended (shown), or never mounted.
                reply = rpc.call_as(DrainStatus(name), DrainReply)
                if reply.code != 0:
                    raise click.ClickException(f"no segment {segment!r} is mounted at {address}")
            if reply.code != 0:
                raise click.ClickException(f"master {address} answered code {reply.code}")
            tty = sys.stdout.isatty()
            while not no_wait and reply.state not in _ENDED:
                line = format_progress(segment, reply)
                click.echo(("\r" + line) if tty else line, nl=not tty)
                time.sleep(0.2)
                reply = rpc.call_as(DrainStatus(name), DrainReply)
    except KVPoolError as exc:
        raise click.ClickException(f"cannot drain {segment} at {address}: {exc}") from exc
    if tty and not no_wait:
        click.echo()
    click.echo(format_progress(segment, reply))
    if reply.failed:
        sys.exit(1)
