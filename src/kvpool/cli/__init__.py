"""The `kvpool` command: one click group whose subcommands are imported only when used.

Each subcommand lives in its own module and exposes a click command; this file only names them,
so `kvpool --help` stays fast and a missing optional dependency of one subcommand never breaks
another. To add one, add a row to `_COMMANDS` (and, for benchmarks, to `_BENCHMARKS`).
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["main"]

# name -> (module, attribute, one-line help)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "master": ("kvpool.cli.master", "master", "Run the metadata master of a pool."),
    "node": ("kvpool.cli.node", "node", "Contribute a memory segment to a pool."),
    "up": ("kvpool.cli.up", "up", "Run the embedded pool: master and one node, one command."),
    "client": ("kvpool.cli.client", "client", "Per-host standalone client for setup_dummy."),
    "status": ("kvpool.cli.status", "status", "Show a pool's segments, clients and objects."),
    "demo": ("kvpool.cli.demo", "demo", "The main job: prefill writes KV cache, decode reuses it."),
    "bench": ("kvpool.cli", "bench", "Benchmarks that print tables (and JSON rows)."),
    "drain": ("kvpool.cli.drain", "drain", "Gracefully unmount a segment: move, wait, unmount."),
}

# `kvpool bench NAME` -> (module, attribute, help)
_BENCHMARKS: dict[str, tuple[str, str, str]] = {
    "master": ("kvpool.bench.master", "command", "Control-plane throughput of the master."),
    "transfer": ("kvpool.bench.transfer", "command", "Data-plane bandwidth: shm and TCP."),
    "store": ("kvpool.bench.store", "command", "Store put/get through the whole client."),
    "reclaim": ("kvpool.bench.reclaim", "command", "Reclaim: hit ratio, cost, tail latency."),
    "l2": ("kvpool.bench.l2", "command", "Engine-side L2 adapters: store/load throughput."),
    "compare": ("kvpool.bench.compare", "command", "kvpool next to Mooncake, Redis, limits."),
    "chaos": ("kvpool.bench.chaos", "command", "Acked writes through crashes and bad frames."),
    "fuzz": ("kvpool.bench.fuzz", "command", "Hostile input at a master and a node; both survive."),
    "ha": ("kvpool.bench.ha", "command", "HA off / --data-dir / standby; failover; snapshots."),
    "llm": ("kvpool.bench.llm", "command", "Real-model TTFT with the pool against recompute."),
    "tiers": ("kvpool.bench.tiers", "command", "Memory and disk-tier get/put beside file I/O."),
}


class _LazyGroup(click.Group):
    def __init__(self, *args: object, table: dict[str, tuple[str, str, str]], **kw: object):
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._table = table

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self._table)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        row = self._table.get(cmd_name)
        if row is None:
            return None
        module_name, attr, help_text = row
        if module_name == __name__ and attr == "bench":
            return bench
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                return _unavailable(cmd_name, help_text, f"{module_name} is not built yet")
            return _unavailable(cmd_name, help_text, f"missing dependency: {exc.name}")
        cmd = getattr(module, attr)
        assert isinstance(cmd, click.Command)
        return cmd

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; a kvpool error that escapes it (a check in a command's body,
        such as a benchmark's own size parsing) is click's error, not a traceback:
        `InvalidParams` a usage error (exit 2, its message names the flag or argument), any
        other `KVPoolError` exit 1 with its message."""
        try:
            return super().invoke(ctx)
        except InvalidParams as exc:
            raise click.UsageError(exc.message) from exc
        except KVPoolError as exc:
            raise click.ClickException(exc.message) from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, row[2]) for name, row in sorted(self._table.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _unavailable(name: str, help_text: str, why: str) -> click.Command:
    def run() -> None:
        raise click.ClickException(f"'{name}' is unavailable: {why}")

    return click.Command(name, callback=run, help=f"{help_text} (unavailable: {why})")


def _version(ctx: click.Context, value: bool) -> None:
    """`kvpool --version`: the package's version and the fused copy's path
    (`kvpool.transfer.native`: "avx2", "scalar", or "off (why)")."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import version

    from kvpool.transfer.native import copy_path

    click.echo(f"kvpool {version('kvpool')} (fused copy: {copy_path})")
    ctx.exit()


@click.group(
    cls=_LazyGroup, table=_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=lambda ctx, _param, value: _version(ctx, value),
    help="Show the version (and which fused copy this install has) and exit.",
)
def main(verbose: int) -> None:
    """kvpool: a distributed KV-cache pool for LLM serving."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")


@click.group(cls=_LazyGroup, table=_BENCHMARKS)
def bench() -> None:
    """Benchmarks. Each prints a table with ratios against a baseline measured in the same run;
    `--json FILE` writes one row per measured case; `--quick` takes seconds (used by the tests)."""
