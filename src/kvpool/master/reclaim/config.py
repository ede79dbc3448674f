"""Settings of the reclaim engine: watermarks, eviction mode, batch sizes.

The user-facing ones are the master's flags (`MasterConfig`: `--eviction-high-watermark-ratio`,
`--eviction-ratio`, `--allow-evict-soft-pinned-objects`, `--eviction-mode`);
`ReclaimConfig.from_master` maps them. The rest are engine tunables with measured defaults.
`EvictionMode` is the master's own enum: cache drops an evicted replica (Mooncake), pool moves
it out of this memory and never loses it (seed 001, "先把 evict 的语义说对").
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.errors import InvalidParams
from kvpool.master.config import EvictionMode, MasterConfig

__all__ = ["EvictionMode", "ReclaimConfig"]


@dataclass(frozen=True, slots=True)
class ReclaimConfig:
    """Reclaim settings; every field has a default and a unit, validated on construction."""

    mode: EvictionMode = EvictionMode.CACHE
    """`--eviction-mode`: cache (drop) or pool (swap out / offload before freeing)."""
    high_watermark_ratio: float = 0.9
    """`--eviction-high-watermark-ratio`: used/capacity above which kswapd wakes (0..1]."""
    eviction_ratio: float = 0.05
    """`--eviction-ratio`: kswapd reclaims down to high watermark minus this (0..1)."""
    allow_evict_soft_pinned: bool = True
    """`--allow-evict-soft-pinned-objects` (cache mode): soft-pinned objects may go, last."""
    isolate_batch: int = 32
    """Records isolated per critical section; bounds how long one holds up the online path."""
    inactive_ratio: float = 1.0
    """kswapd demotes from active while active bytes exceed this times inactive bytes (Linux's
    inactive_ratio): 1.0 keeps at least half of the resident bytes where new objects prove
    themselves."""
    scan_limit: int = 1024
    """Records one pass (a direct reclaim, a kswapd step) looks at, at most: a pool full of
    leased or pinned objects costs a failing PutStart this much, not a walk of every object
    (records looked at and kept rotate to the head, so the next pass sees others)."""
    kswapd_step_records: int = 64
    """Records (of average size) one kswapd step reclaims at most before the event loop gets a
    turn. A step's cost is per record, not per byte, so a step's length does not depend on
    the object size (docs/performance.md, reclaim section, has the measured step times)."""

    range_scan_limit: int = 512
    """Records one range reclaim (`fit.RangeReclaimer`: a put that direct reclaim left without
    a free block large enough) isolates and looks at, at most: the oldest of every shard's
    inactive list, in proportion to its length. Bounds the cost of that slow path."""

    defrag_max_moves: int = 32
    """Pool mode: moves one defragmentation (`defrag.Defragmenter`: a put found the bytes of a
    segment only in pieces) may start for one range, at most; a range that needs more is not
    made."""
    defrag_max_in_flight: int = 128
    """Pool mode: defragmentation moves running at once, at most (over every range)."""
    defrag_retry_ms: int = 50
    """Pool mode: the retry hint (milliseconds) of a put refused while its range is being made:
    about a node's task poll (50 ms) plus the copy."""

    kswapd_backoff: float = 1.0
    """Seconds kswapd stays asleep above the high watermark after a step found nothing to
    reclaim (a failed allocation wakes it at once): without it every PutEnd above the
    watermark would wake a step that scans `scan_limit` records for nothing."""
    direct_swap_out: bool = True
    """Pool mode: whether direct reclaim may start swap-outs. The master turns it off: a put
    cannot wait for a move, so there direct reclaim only drops droppable replicas and kswapd
    (which runs ahead, between the watermarks) does the moving."""

    def __post_init__(self) -> None:
        if not 0.0 < self.high_watermark_ratio <= 1.0:
            raise InvalidParams(
                f"eviction_high_watermark_ratio must be in (0, 1], got {self.high_watermark_ratio}"
            )
        if not 0.0 <= self.eviction_ratio < 1.0:
            raise InvalidParams(f"eviction_ratio must be in [0, 1), got {self.eviction_ratio}")
        if self.isolate_batch < 1:
            raise InvalidParams(f"isolate_batch must be >= 1, got {self.isolate_batch}")
        if self.inactive_ratio <= 0:
            raise InvalidParams(f"inactive_ratio must be > 0, got {self.inactive_ratio}")
        if self.scan_limit < 1:
            raise InvalidParams(f"scan_limit must be >= 1, got {self.scan_limit}")
        if self.range_scan_limit < 1:
            raise InvalidParams(f"range_scan_limit must be >= 1, got {self.range_scan_limit}")
        if self.defrag_max_moves < 1:
            raise InvalidParams(f"defrag_max_moves must be >= 1, got {self.defrag_max_moves}")
        if self.defrag_max_in_flight < 1:
            raise InvalidParams(
                f"defrag_max_in_flight must be >= 1, got {self.defrag_max_in_flight}"
            )
        if not 1 <= self.defrag_retry_ms <= 10_000:
            raise InvalidParams(
                f"defrag_retry_ms must be in [1, 10000] ms, got {self.defrag_retry_ms}"
            )
        if self.kswapd_backoff < 0:
            raise InvalidParams(f"kswapd_backoff must be >= 0 seconds, got {self.kswapd_backoff}")
        if self.kswapd_step_records < 1:
            raise InvalidParams(f"kswapd_step_records must be >= 1, got {self.kswapd_step_records}")

    @classmethod
    def from_master(cls, config: MasterConfig, **tunables: int | float) -> ReclaimConfig:
        """The reclaim settings a master runs with (its flags, plus engine `tunables`)."""
        return cls(
            mode=config.eviction_mode,
            high_watermark_ratio=config.eviction_high_watermark_ratio,
            eviction_ratio=config.eviction_ratio,
            allow_evict_soft_pinned=config.allow_evict_soft_pinned_objects,
            **tunables,  # type: ignore[arg-type]
        )

    @property
    def low_watermark_ratio(self) -> float:
        """Where kswapd stops: high watermark minus eviction ratio (never below 0)."""
        return max(0.0, self.high_watermark_ratio - self.eviction_ratio)
