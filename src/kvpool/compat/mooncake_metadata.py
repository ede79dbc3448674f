"""`mooncake_http_metadata_server` on kvpool: a harmless stand-in that explains itself.

Mooncake's Transfer Engine publishes each client's segment descriptors in a metadata service
(an HTTP key-value server, etcd or redis) that its peers look up before a transfer, and
Mooncake's guides start one (`python -m mooncake.http_metadata_server --port 8080`). kvpool
needs none: its master keeps every segment's address and the data plane learns where to read
from the master's answers. Scripts that start the server keep working: this command takes the
same options (`--host`, `--port`, `--log-level`), logs why nothing is served, binds no port,
and stays up until SIGINT or SIGTERM (so a supervisor or a script that later kills it sees what
it expects). `--exit` returns at once instead.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

__all__ = ["main"]

log = logging.getLogger("mooncake_http_metadata_server")

WHY = (
    "kvpool needs no HTTP metadata server: its master keeps the address of every segment, "
    "so nothing is served on %s:%d (metadata_server in setup() may name it; it is never "
    "contacted). Waiting for SIGINT / SIGTERM."
)


def main(argv: Sequence[str] | None = None) -> int:
    """The `mooncake_http_metadata_server` console script."""
    parser = argparse.ArgumentParser(
        prog="mooncake_http_metadata_server",
        description="Mooncake's HTTP metadata server, which kvpool does not need (a no-op).",
    )
    parser.add_argument("--port", type=int, default=8080, help="Port (not bound).")
    parser.add_argument("--host", default="0.0.0.0", help="Host (not bound).")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="Logging level.",
    )
    parser.add_argument("--exit", action="store_true", help="Log the reason and return at once.")
    args = parser.parse_args(None if argv is None else list(argv))
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.exit:
        log.warning(WHY.removesuffix(" Waiting for SIGINT / SIGTERM."), args.host, args.port)
        return 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    log.warning(WHY, args.host, args.port)  # after the handlers: a stop right after it is clean
    while not stop.wait(3600):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
