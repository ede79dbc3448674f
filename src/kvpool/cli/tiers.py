"""The command-line options of the tiers below memory (docs/parts/tiers.md), kept in one place:
`master_tier_options` for `kvpool master` (offload policy, promotion on hit, and Mooncake's
spellings of them) and `node_tier_options` for `kvpool node` (the disk tier)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from kvpool.cli.params import Duration, Size
from kvpool.master.tier_config import MAX_ORPHAN_GRACE_S, OffloadPolicy, TierConfig

__all__ = ["master_tier_options", "node_tier_options", "tier_config"]

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


def node_tier_options(f: F) -> F:
    """Add `--offload-dir` (repeatable), `--offload-size` and `--dfs-root` (keyword arguments
    offload_dir, a tuple of directories, offload_size and dfs_root)."""
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
