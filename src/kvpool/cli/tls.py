"""The TLS options every command that listens on or dials TCP takes (docs/security.md, "TLS").

`tls_options` adds ``--tls-cert``, ``--tls-key`` and ``--tls-ca`` (each defaulting to its
``$KVPOOL_TLS_*`` variable); `tls_config` turns their values into a `TlsConfig` (None: plain).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kvpool.errors import KVPoolError
from kvpool.rpc.tls import TlsConfig

__all__ = ["tls_config", "tls_options"]

F = TypeVar("F", bound=Callable[..., Any])


def tls_options(func: F) -> F:
    """Add the three TLS options to a click command."""
    path = click.Path(exists=True, dir_okay=False)
    for flag, help_text in reversed(
        [
            (
                "--tls-cert",
                "PEM certificate this process presents (a server's; a client's for mutual "
                "TLS). With it, its TCP listeners speak TLS only [default: $KVPOOL_TLS_CERT].",
            ),
            ("--tls-key", "The private key of --tls-cert [default: $KVPOOL_TLS_KEY]."),
            (
                "--tls-ca",
                "PEM CA bundle: servers are verified with it, and a server given it requires "
                "client certificates it signed (mutual TLS) [default: $KVPOOL_TLS_CA].",
            ),
        ]
    ):
        func = click.option(flag, default=None, type=path, metavar="PATH", help=help_text)(func)
    return func


def tls_config(cert: str | None, key: str | None, ca: str | None) -> TlsConfig | None:
    """The TLS settings of the options (or the environment); a usage error when they do not
    fit together."""
    try:
        return TlsConfig.resolve(cert, key, ca)
    except KVPoolError as exc:
        raise click.UsageError(exc.message) from exc
