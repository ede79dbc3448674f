"""`mooncake_master`: Mooncake's master command line, running a kvpool master.

::

    mooncake_master --rpc_port=50051 --default_kv_lease_ttl=500 --eviction_high_watermark_ratio=0.9

reads the flags with gflags' rules and Mooncake's units (`kvpool.compat.mooncake_flags`), logs
one warning per flag of a feature kvpool lacks, and runs `kvpool master` with the arguments that
mean the same, so it serves, prints and stops exactly as `kvpool master` does (its
`listening on HOST:PORT` line, SIGINT / SIGTERM). Arguments after `--` go to `kvpool master`
unchanged. A bad flag exits 2 with the message on stderr.

Installed as the `mooncake_master` console script by compat/mooncake-shim (next to
`mooncake.store`); without the shim, `python -m kvpool.cli.mooncake_master` is the same command.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from kvpool import __version__
from kvpool.compat.mooncake_flags import (
    help_text,
    load_config_file,
    merge,
    parse_argv,
    translate,
)
from kvpool.errors import InvalidParams

__all__ = ["kvpool_master_argv", "main"]

log = logging.getLogger("mooncake_master")


def kvpool_master_argv(argv: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
    """`kvpool master`'s arguments for a `mooncake_master` command line (logs its warnings);
    InvalidParams when the command line is wrong or asks for what kvpool cannot do."""
    parsed = parse_argv(argv)
    values = parsed.values
    path = values.get("config_path") or values.get("conf_path")
    if path:
        values = merge(load_config_file(path), values)
    launch = translate(values, env=os.environ if env is None else env)
    level = logging.DEBUG if launch.verbosity >= 2 else logging.INFO if launch.verbosity else None
    if level is not None:
        logging.getLogger().setLevel(level)
    for line in launch.warnings:
        log.warning("%s", line)
    for line in launch.notes:
        log.info("%s", line)
    if parsed.positional:
        log.warning("arguments that are not flags are ignored: %s", " ".join(parsed.positional))
    args = list(launch.argv)
    if launch.ha_url is not None:  # HA (etcd): kvpool master --ha etcd://H:P[,H:P]/CLUSTER_ID
        args += ["--ha", launch.ha_url]
    return args + parsed.passthrough


def main(argv: Sequence[str] | None = None) -> int:
    """The `mooncake_master` console script."""
    args = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    try:
        parsed = parse_argv(args)
        if parsed.help:
            sys.stdout.write(help_text())
            return 0
        if parsed.version:
            sys.stdout.write(f"mooncake_master (kvpool {__version__})\n")
            return 0
        master_args = kvpool_master_argv(args)
    except InvalidParams as exc:
        sys.stderr.write(f"mooncake_master: {exc.message}\n")
        return 2
    log.info("kvpool master %s", " ".join(master_args))
    from kvpool.cli.master import master

    code: object = 0
    try:
        master.main(args=master_args, prog_name="mooncake_master")  # exits with its code
    except SystemExit as exc:
        code = exc.code
    return code if isinstance(code, int) else 0 if code is None else 1


if __name__ == "__main__":
    sys.exit(main())
