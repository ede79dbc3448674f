"""`kvpool bench compare`: kvpool next to Mooncake, Redis and the physical limits, in one run.

What it measures (all on this host, loopback only, one client process):

| system/path     | what                                                                  |
|-----------------|-----------------------------------------------------------------------|
| kvpool/shm      | Store in this process, data in a `kvpool node` process, same-host shm |
| kvpool/tcp      | the same with `protocol="tcp"` (the path between hosts)               |
| mooncake/tcp    | the real Mooncake Store, segment in a second process, TCP transport   |
| redis/tcp       | a private redis-server, redis-py + hiredis, MSET / MGET batches       |
| limit/memcpy    | numpy copy into and out of a pre-faulted arena: the shm ceiling       |
| limit/socket    | sendmsg -> recv_into over loopback TCP, one round trip: TCP's ceiling |

Workloads: put and get of single values of every `--sizes` size, and of batches of `--batch`
values for sizes below 1 MiB; every value read is compared byte for byte with what was written
(a mismatch stops the run with an error). Where a client has a copying and a zero-copy call,
the warm-up times both and the faster is measured (the `api` column). Systems run interleaved
(see `kvpool.bench.peers.workload`), and the table quotes medians over rounds and ratios of
kvpool to every other row, by throughput and by p50, with the project's targets underneath.

`--seconds` is the measured time per system, case and op, split over `--rounds` rounds; start-up
and verification come on top. `--quick` is a seconds-long smoke run for the test suite.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TextIO

import click

from kvpool.bench.peers.base import BenchError, Driver, Unavailable
from kvpool.bench.peers.kvpool_peer import KvpoolDriver
from kvpool.bench.peers.limits import MemcpyDriver, SocketDriver
from kvpool.bench.peers.mooncake_peer import MooncakeDriver
from kvpool.bench.peers.redis_peer import RedisDriver
from kvpool.bench.peers.report import (
    Skipped,
    json_rows,
    plot,
    render_markdown,
    render_table,
    render_targets,
)
from kvpool.bench.peers.workload import (
    Measurement,
    RunPlan,
    capacity_for,
    plan_cases,
    run_cases,
)
from kvpool.bench.rows import write_json
from kvpool.children import ChildError
from kvpool.config import parse_size

__all__ = ["SYSTEMS", "CompareOptions", "Progress", "command", "make_drivers", "run_compare"]

SYSTEMS = ("kvpool", "mooncake", "redis", "limit")
DEFAULT_SIZES = "4KiB,1MiB,16MiB"
_ROUND_BYTES = 256 << 20  # most value bytes any store holds at once (a fill of 16 x 16 MiB)
_QUICK_ROUND_BYTES = 32 << 20


def make_drivers(systems: Sequence[str]) -> list[Driver]:
    """The drivers of the named systems, in table order."""
    drivers: list[Driver] = []
    if "kvpool" in systems:
        drivers += [KvpoolDriver("shm"), KvpoolDriver("tcp")]
        drivers += [KvpoolDriver("shm", fast=True), KvpoolDriver("tcp", fast=True)]
    if "mooncake" in systems:
        drivers.append(MooncakeDriver())
    if "redis" in systems:
        drivers += [RedisDriver("tcp"), RedisDriver("unix")]
    if "limit" in systems:
        drivers += [MemcpyDriver(), SocketDriver()]
    return drivers


class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._out = stream if stream is not None else sys.stderr
        self._tty = self._out.isatty()
        self._t0 = time.monotonic()
        self._last = ""

    def __call__(self, done: int, total: int, what: str) -> None:
        width = 30
        filled = width * done // max(total, 1)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
            f"{time.monotonic() - self._t0:5.0f}s {what}"
        )
        if self._tty:  # redraw in place; pad over a longer previous line
            self._out.write("\r" + line.ljust(len(self._last)))
            if done >= total:
                self._out.write("\n")
        else:
            self._out.write(line + "\n")
        self._last = line
        self._out.flush()

    def note(self, text: str) -> None:
        """A line of its own (a system starting or skipped), below the bar."""
        self._out.write(("\n" if self._tty and self._last else "") + text + "\n")
        self._last = ""
        self._out.flush()


@dataclass(frozen=True, kw_only=True)
class CompareOptions:
    """What `run_compare` runs; `--quick` shrinks the time and the memory."""

    sizes: Sequence[int]
    """Value sizes in bytes."""
    batch: int = 64
    """Keys per batch call (batches run for sizes below 1 MiB)."""
    seconds: float = 2.0
    """Measured seconds per system, case and op, over all rounds."""
    rounds: int = 5
    """Interleaved rounds per case."""
    systems: Sequence[str] = SYSTEMS
    """Which of `SYSTEMS` to run."""
    round_bytes: int = _ROUND_BYTES
    """Most value bytes a store holds at once (bounds the key set of a fill)."""

    def __post_init__(self) -> None:
        if not self.sizes or any(s <= 0 for s in self.sizes):
            raise click.BadParameter(f"sizes must be positive, got {list(self.sizes)}")
        if self.batch < 1:
            raise click.BadParameter(f"--batch must be >= 1, got {self.batch}")
        if self.seconds <= 0 or self.rounds < 1:
            raise click.BadParameter(
                f"need --seconds > 0 and --rounds >= 1, got {self.seconds} and {self.rounds}"
            )
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown:
            raise click.BadParameter(f"unknown systems {sorted(unknown)}; known: {SYSTEMS}")


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Turn SIGTERM into an exception while running, so `finally` stops every child."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: nothing to install, nothing to restore
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_compare(
    opts: CompareOptions,
    progress: Progress | None = None,
    drivers: Sequence[Driver] | None = None,
) -> tuple[list[Measurement], list[Skipped]]:
    """Set up every system, run the interleaved cases, tear everything down (always).

    `drivers` defaults to `make_drivers(opts.systems)`; tests pass their own.
    """
    progress = progress or Progress()
    cases = plan_cases(opts.sizes, opts.batch, opts.round_bytes)
    capacity = capacity_for(cases)
    plan = RunPlan(rounds=opts.rounds, seconds_per_phase=opts.seconds / opts.rounds)
    if drivers is None:
        drivers = make_drivers(opts.systems)
    ready: list[Driver] = []
    skipped: list[Skipped] = []
    with _sigterm_unwinds(), contextlib.ExitStack() as stack:
        for d in drivers:
            stack.callback(d.teardown)  # also after a half-finished setup
            progress.note(f"starting {d.label} ...")
            try:
                d.setup(capacity)
            except Unavailable as exc:
                d.teardown()
                skipped.append(Skipped(d.label, exc.reason, exc.install))
                progress.note(f"skipped {d.label}: {exc.reason}")
                continue
            ready.append(d)
        if not ready:
            return [], skipped
        results = run_cases(ready, cases, plan, progress)
    return results, skipped


def _machine() -> str:
    """The machine line of the report, with the fused copy's path (`kvpool.transfer.native`):
    its numbers depend on it."""
    cpus = os.cpu_count() or 0
    try:
        import psutil

        mem = f", {psutil.virtual_memory().total / (1 << 30):.0f} GiB RAM"
    except ImportError:  # pragma: no cover - psutil is a core dependency
        mem = ""
    from kvpool.transfer.native import copy_path

    return (
        f"{platform.machine()} {platform.system()} {platform.release()}, {cpus} CPUs{mem}, "
        f"Python {platform.python_version()}, fused copy {copy_path}"
    )


@click.command(name="compare")
@click.option(
    "--sizes", default=DEFAULT_SIZES, show_default=True, help="Value sizes, comma-separated."
)
@click.option("--batch", default=64, show_default=True, help="Keys per batch call (sizes < 1 MiB).")
@click.option(
    "--seconds",
    type=float,
    default=None,
    help="Measured seconds per system, case and op, over all rounds [default: 2; --quick 0.1].",
)
@click.option(
    "--rounds", type=int, default=None, help="Interleaved rounds [default: 5; --quick 2]."
)
@click.option(
    "--systems",
    default=",".join(SYSTEMS),
    show_default=True,
    help="Which systems to run (kvpool, mooncake, redis, limit).",
)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write JSON rows.")
@click.option(
    "--plot", "plot_file", type=click.Path(dir_okay=False), help="Draw throughput to a PNG."
)
@click.option(
    "--markdown",
    "markdown_file",
    type=click.Path(dir_okay=False),
    help="Write the table and targets as Markdown (for docs/performance.md).",
)
@click.option("--quick", is_flag=True, help="A few seconds in all (what the tests run).")
def command(
    *,
    sizes: str,
    batch: int,
    seconds: float | None,
    rounds: int | None,
    systems: str,
    json_file: str | None,
    plot_file: str | None,
    markdown_file: str | None,
    quick: bool,
) -> None:
    """kvpool next to Mooncake, Redis and the physical limits, interleaved in one run.

    Systems that are not installed are skipped, with the command that installs them.
    """
    try:
        size_list = [parse_size(s, name="--sizes", minimum=1) for s in sizes.split(",") if s]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    opts = CompareOptions(
        sizes=size_list,
        batch=batch,
        seconds=seconds if seconds is not None else (0.1 if quick else 2.0),
        rounds=rounds if rounds is not None else (2 if quick else 5),
        systems=[s.strip() for s in systems.split(",") if s.strip()],
        round_bytes=_QUICK_ROUND_BYTES if quick else _ROUND_BYTES,
    )
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    try:
        results, skipped = run_compare(opts)
    except (BenchError, ChildError) as exc:
        raise click.ClickException(f"benchmark failed: {exc}") from exc
    heading = (
        f"kvpool bench compare on {_machine()}\n"
        f"{opts.rounds} rounds x {opts.seconds / opts.rounds:.2f} s per phase, "
        f"{time.monotonic() - started:.0f} s in all; throughput = median over rounds; "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    targets = render_targets(results)
    click.echo(heading + "\n")
    click.echo(render_table(results, skipped))
    click.echo("")
    click.echo(targets)
    if markdown_file:
        with open(markdown_file, "w", encoding="utf-8") as f:
            f.write(f"{heading}\n\n{render_markdown(results, skipped)}\n\n```\n{targets}\n```\n")
    if json_file:
        write_json(json_file, json_rows(results))
    if plot_file:
        try:
            plot(results, plot_file, title=f"kvpool bench compare ({_machine()})")
        except ImportError as exc:
            raise click.ClickException(
                f"--plot needs matplotlib ({exc}); pip install 'kvpool[plot]'"
            ) from exc
