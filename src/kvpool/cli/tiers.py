"""The command-line options of the tiers below memory (docs/parts/tiers.md), kept in one place:
`master_tier_options` for `kvpool master` (offload policy, promotion on hit, the DFS check, and
Mooncake's spellings of them) and `node_tier_options` for `kvpool node` and `kvpool up` (the
disk tier and its background check, `DiskCheck`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

import click

from kvpool.cli.params import Duration, Size
from kvpool.client.disk import CHECK_BYTES_PER_ROUND, CHECK_INTERVAL_S, CHECK_PER_ROUND
from kvpool.config import format_size
from kvpool.master.tier_config import MAX_ORPHAN_GRACE_S, OffloadPolicy, TierConfig

__all__ = ["DiskCheck", "master_tier_options", "node_tier_options", "tier_config"]

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULTS = TierConfig()


def master_tier_options(f: F) -> F:
    """Add the master's tier options (they arrive as keyword arguments; see `tier_config`)."""
    options = [
        click.option(
            "--offload-policy",
            type=click.Choice([p.value for p in OffloadPolicy]),
            default=None,
            help="When objects are copied to node disk tiers: off (default), eager (after "
            "every put) or on-evict (before reclaim drops the last memory replica).",
        ),
        click.option(
            "--offload-per-round",
            type=click.IntRange(1),
            default=_DEFAULTS.offload_per_round,
            show_default=True,
            help="Offload tasks started per tick at most.",
        ),
        click.option(
            "--offload-queue-limit",
            type=click.IntRange(1),
            default=_DEFAULTS.offload_queue_limit,
            show_default=True,
            help="Objects waiting for an eager offload at most (the oldest are dropped).",
        ),
        click.option(
            "--promotion-on-hit/--no-promotion-on-hit",
            default=None,
            help="Copy disk-only objects read often back to memory (on by default).",
        ),
        click.option(
            "--promotion-admission-threshold",
            type=click.IntRange(1),
            default=None,
            help=f"Reads of a disk-only object that promote it [default: "
            f"{_DEFAULTS.promotion_admission_threshold}].",
        ),
        click.option(
            "--dfs-root",
            type=click.Path(file_okay=False),
            default=None,
            help="A directory every node and client sees (NFS, 3FS, a shared volume): puts "
            "with dfs_replica_num=1 also write their object there; it survives every node.",
        ),
        click.option(
            "--dfs-check-interval",
            type=Duration(minimum=0.001, maximum=3600),
            default="100ms",
            show_default=True,
            help="Time between two rounds of the DFS check (vanished files, orphan files).",
        ),
        click.option(
            "--dfs-check-per-round",
            type=click.IntRange(1, 1 << 20),
            default=_DEFAULTS.dfs_check_per_round,
            show_default=True,
            help="DFS replicas whose file is looked for, and directory entries looked at for "
            "orphans, per round.",
        ),
        click.option(
            "--dfs-orphan-grace",
            type=Duration(minimum=0, maximum=MAX_ORPHAN_GRACE_S),
            default="5min",
            show_default=True,
            help="Age past which a file in the DFS directory that no object names is removed "
            "(the leader does it).",
        ),
        click.option("--enable_offload", is_flag=True, help="Mooncake: --offload-policy eager."),
        click.option(
            "--offload_on_evict", is_flag=True, help="Mooncake: --offload-policy on-evict."
        ),
        click.option(
            "--promotion_on_hit",
            "promotion_on_hit_mc",
            type=bool,
            default=None,
            help="Mooncake: --promotion-on-hit (true/false).",
        ),
        click.option(
            "--promotion_admission_threshold",
            "promotion_admission_threshold_mc",
            type=click.IntRange(1),
            default=None,
            help="Mooncake: --promotion-admission-threshold.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


_MASTER_KEYS = (
    "offload_policy",
    "offload_per_round",
    "offload_queue_limit",
    "promotion_on_hit",
    "promotion_admission_threshold",
    "enable_offload",
    "offload_on_evict",
    "promotion_on_hit_mc",
    "promotion_admission_threshold_mc",
    "dfs_root",
    "dfs_check_interval",
    "dfs_check_per_round",
    "dfs_orphan_grace",
)


def tier_config(kwargs: dict[str, Any]) -> TierConfig:
    """Pop the tier options out of a command's `kwargs` and build the `TierConfig`."""
    v = {k: kwargs.pop(k) for k in _MASTER_KEYS if k in kwargs}
    policy = v.get("offload_policy")
    if policy is None:
        if v.get("offload_on_evict"):
            policy = OffloadPolicy.ON_EVICT
        elif v.get("enable_offload"):
            policy = OffloadPolicy.EAGER
        else:
            policy = OffloadPolicy.OFF
    on_hit = v.get("promotion_on_hit")
    if on_hit is None:
        on_hit = v.get("promotion_on_hit_mc")
    threshold = v.get("promotion_admission_threshold") or v.get("promotion_admission_threshold_mc")
    return TierConfig(
        offload_policy=OffloadPolicy(policy),
        offload_per_round=v.get("offload_per_round", _DEFAULTS.offload_per_round),
        offload_queue_limit=v.get("offload_queue_limit", _DEFAULTS.offload_queue_limit),
        promotion_on_hit=_DEFAULTS.promotion_on_hit if on_hit is None else bool(on_hit),
        promotion_admission_threshold=threshold or _DEFAULTS.promotion_admission_threshold,
        dfs_root=os.path.abspath(v["dfs_root"]) if v.get("dfs_root") else None,
        dfs_check_interval=v.get("dfs_check_interval", _DEFAULTS.dfs_check_interval),
        dfs_check_per_round=v.get("dfs_check_per_round", _DEFAULTS.dfs_check_per_round),
        dfs_orphan_grace=v.get("dfs_orphan_grace", _DEFAULTS.dfs_orphan_grace),
    )


@dataclass(frozen=True, slots=True)
class DiskCheck:
    """The disk tier's background check as `kvpool node` / `kvpool up` were told (None: the
    `DiskTier` default; `kvpool.client.disk`)."""

    interval: float | None = None
    """Seconds between two rounds (0: no check)."""
    per_round: int | None = None
    """Objects re-read per round at most."""
    bytes_per_round: int | None = None
    """Bytes re-read per round at most."""

    def given(self, offload_dirs: tuple[str, ...]) -> DiskCheck:
        """Itself, or a usage error naming the option given without `--offload-dir`."""
        if not offload_dirs:
            for name, value in zip(_DISK_CHECK_FLAGS, self.args(), strict=True):
                if value is not None:
                    raise click.UsageError(f"{name} needs --offload-dir (a disk tier to check)")
        return self

    def args(self) -> tuple[float | int | None, ...]:
        return (self.interval, self.per_round, self.bytes_per_round)

    def kwargs(self) -> dict[str, Any]:
        """The `DiskTier(...)` keyword arguments of the options given."""
        names = ("check_interval", "check_per_round", "check_bytes_per_round")
        return {n: v for n, v in zip(names, self.args(), strict=True) if v is not None}

    def argv(self) -> tuple[str, ...]:
        """The options given, as `kvpool node` arguments (`kvpool up` passes them on)."""
        return tuple(
            a
            for name, v in zip(_DISK_CHECK_FLAGS, self.args(), strict=True)
            if v is not None
            for a in (name, _seconds_arg(v) if isinstance(v, float) else str(v))
        )

    def describe(self) -> str:
        """What the node says about its check, from the values `DiskTier` takes."""
        interval = CHECK_INTERVAL_S if self.interval is None else self.interval
        if interval <= 0:
            return "no background check"
        per_round = CHECK_PER_ROUND if self.per_round is None else self.per_round
        nbytes = CHECK_BYTES_PER_ROUND if self.bytes_per_round is None else self.bytes_per_round
        return (
            f"checked every {interval:g} s ({per_round} object(s), {format_size(nbytes)} a round)"
        )


_DISK_CHECK_FLAGS = (
    "--disk-check-interval",
    "--disk-check-per-round",
    "--disk-check-bytes-per-round",
)


def node_tier_options(f: F) -> F:
    """Add `--offload-dir` (repeatable), `--offload-size`, `--dfs-root` and the disk check's
    `--disk-check-*` options (keyword arguments offload_dir, a tuple of directories,
    offload_size, dfs_root, disk_check_interval, disk_check_per_round and
    disk_check_bytes_per_round: see `DiskCheck`)."""
    f = click.option(
        "--disk-check-bytes-per-round",
        type=Size(minimum=1),
        default=None,
        help="Bytes the disk tier's background check re-reads per round at most "
        f"[default: {format_size(CHECK_BYTES_PER_ROUND)}].",
    )(f)
    f = click.option(
        "--disk-check-per-round",
        type=click.IntRange(1, 1 << 20),
        default=None,
        help=f"Objects the disk tier's background check re-reads per round at most "
        f"[default: {CHECK_PER_ROUND}].",
    )(f)
    f = click.option(
        "--disk-check-interval",
        type=Duration(0, 3600),
        default=None,
        help="Time between two rounds of the disk tier's background check, which re-reads "
        f"objects against their checksum (0: no check) [default: {CHECK_INTERVAL_S:g}s].",
    )(f)
    f = click.option(
        "--dfs-root",
        type=click.Path(exists=True, file_okay=False),
        default=None,
        help="Where the master's --dfs-root directory is mounted here, when not at the "
        "master's path: DFS files are read and written under it (kvpool.client.dfs).",
    )(f)
    f = click.option(
        "--offload-size",
        type=Size(minimum=1 << 20),
        default="1GiB",
        show_default=True,
        help="Bytes of the disk tier in each --offload-dir (reserved up front).",
    )(f)
    return click.option(
        "--offload-dir",
        type=click.Path(file_okay=False),
        multiple=True,
        help="A directory for this node's disk tier (objects offloaded from memory; they "
        "survive a restart with the same directory). Repeat it for several disks: one file "
        "of --offload-size in each.",
    )(f)


def _seconds_arg(v: float) -> str:
    """`v` seconds as a duration the node's parser (`kvpool.config.parse_duration`) reads back
    to the same float: the digits of `repr(v)` written out (it reads no exponent, which `repr`
    of a value under 1e-4 has), a bare number of seconds (no unit factor, so no rounding);
    `repr(v)` itself whenever that has no exponent."""
    return f"{Decimal(repr(v)):f}"
