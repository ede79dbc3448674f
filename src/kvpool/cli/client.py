"""`kvpool client`: the per-host standalone client that Mooncake-style dummy clients attach to.

::

    kvpool client --master 127.0.0.1:50051 --port 50052 --segment-size 4GiB

contributes `--segment-size` bytes of this host's memory to the pool and serves the attach
service of `setup_dummy(mem_pool_size, local_buffer_size, "127.0.0.1:50052")`
(`kvpool.compat.mooncake_client.StandaloneClient`: the abstract Unix socket
`@mooncake_client_<port>.sock` and TCP on `--host`, 127.0.0.1 by default). It prints
`kvpool client listening on HOST:PORT` once it serves and exits 0 on SIGINT / SIGTERM, after
unmounting its segment. `mooncake_client` (the shim) is the same process with Mooncake's flags.
"""

from __future__ import annotations

import signal
import threading

import click

from kvpool.cli.params import Address, Name, Size
from kvpool.cli.tls import tls_config, tls_options
from kvpool.compat.mooncake_client import StandaloneClient
from kvpool.errors import KVPoolError

__all__ = ["client"]


@click.command()
@click.option("--master", default="127.0.0.1:50051", show_default=True, type=Address())
@click.option("--host", default="127.0.0.1", show_default=True, type=Name(), help="TCP bind.")
@click.option(
    "--port", default=50052, show_default=True, type=click.IntRange(0, 65535), help="Attach port."
)
@click.option(
    "--segment-size",
    default="4GiB",
    show_default=True,
    type=Size(minimum=4096),
    help="Memory this host contributes to the pool.",
)
@click.option("--tenant", default="default", show_default=True, type=Name())
@click.option(
    "--token-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="File whose first line is this client's token for a pool with credentials "
    "[default: $KVPOOL_AUTH_TOKEN]. Dummy clients attached here act with it.",
)
@tls_options
def client(
    *,
    master: str,
    host: str,
    port: int,
    segment_size: int,
    tenant: str,
    token_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
) -> None:
    """Contribute this host's memory and serve dummy clients (setup_dummy) until stopped."""
    tls = tls_config(tls_cert, tls_key, tls_ca)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        standalone = StandaloneClient(
            master,
            segment_size,
            host=host,
            port=port,
            tenant=tenant,
            token_file=token_file or "",
            tls_ca=tls.ca if tls is not None else "",
            tls_cert=tls.cert if tls is not None else "",
            tls_key=tls.key if tls is not None else "",
        )
    except (KVPoolError, OSError) as exc:
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc}") from exc
    try:
        click.echo(f"kvpool client listening on {standalone.host}:{standalone.port}")
        stop.wait()
        click.echo("kvpool client: stopping")
    finally:
        standalone.close()
