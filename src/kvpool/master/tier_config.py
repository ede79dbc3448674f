"""Settings of the tiers below memory, on the master: offload policy and promotion on hit.

One frozen dataclass, a field of `MasterConfig` (`MasterConfig.tiers`), so the tier work stays
in its own modules (`tiers.py`, docs/parts/tiers.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvpool.errors import InvalidParams

__all__ = ["MAX_ORPHAN_GRACE_S", "OffloadPolicy", "TierConfig"]

MAX_ORPHAN_GRACE_S = 30 * 86400.0
"""The longest grace an orphan DFS file may be given (30 days)."""


class OffloadPolicy(StrEnum):
    """When the master copies objects from memory to a node's disk tier."""

    OFF = "off"
    """Never (disk replicas only come from nodes that re-register them)."""
    EAGER = "eager"
    """After every completed put, in the background (a copy task per object)."""
    ON_EVICT = "on-evict"
    """When reclaim would drop an object's last memory replica: it is moved to disk first."""


@dataclass(frozen=True, slots=True)
class TierConfig:
    """The master's tier settings (counts are objects, per tick of the repair loop)."""

    offload_policy: OffloadPolicy = OffloadPolicy.OFF
    """off | eager | on-evict (Mooncake: --enable_offload, --offload_on_evict)."""
    offload_queue_limit: int = 65536
    """Objects waiting for an eager offload; past it the oldest are forgotten (counted)."""
    offload_per_round: int = 64
    """Offload tasks started per tick at most."""
    offload_max_in_flight: int = 256
    """Offload and promotion tasks running at once at most."""
    promotion_on_hit: bool = True
    """Reads of disk-only objects are counted and hot ones copied back to memory."""
    promotion_admission_threshold: int = 2
    """Reads of a disk-only object that earn it a memory replica again."""
    promotion_per_round: int = 16
    """Promotion tasks started per tick at most."""
    promotion_table_limit: int = 65536
    """Distinct objects whose reads are counted at once (the table is cleared past it)."""
    dfs_root: str | None = None
    """A directory every node and client sees (NFS, 3FS, a shared volume): puts asking for
    `dfs_replica_num=1` also write their object there (None: no DFS tier)."""
    dfs_check_per_round: int = 64
    """DFS replicas whose file is looked for, and directory entries looked at for orphan
    files, per check round (a vanished replica is dropped, an orphan file removed)."""
    dfs_check_interval: float = 0.1
    """Seconds between two rounds of the DFS check (0.001-3600)."""
    dfs_orphan_grace: float = 300.0
    """Seconds a file in the DFS directory that no object names is left alone before the
    check removes it as an orphan (0-30 days; its modification time counts)."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "offload_policy", OffloadPolicy(self.offload_policy))
        except ValueError:
            choices = ", ".join(p.value for p in OffloadPolicy)
            raise InvalidParams(
                f"unknown offload_policy {self.offload_policy!r} (one of {choices})"
            ) from None
        for name in (
            "offload_queue_limit",
            "offload_per_round",
            "offload_max_in_flight",
            "promotion_admission_threshold",
            "promotion_per_round",
            "promotion_table_limit",
            "dfs_check_per_round",
        ):
            if getattr(self, name) < 1:
                raise InvalidParams(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.001 <= self.dfs_check_interval <= 3600:  # also refuses NaN
            raise InvalidParams(
                f"dfs_check_interval must be 0.001-3600 s, got {self.dfs_check_interval!r}"
            )
        if not 0 <= self.dfs_orphan_grace <= MAX_ORPHAN_GRACE_S:
            raise InvalidParams(
                f"dfs_orphan_grace must be 0-{MAX_ORPHAN_GRACE_S:.0f} s, "
                f"got {self.dfs_orphan_grace!r}"
            )
