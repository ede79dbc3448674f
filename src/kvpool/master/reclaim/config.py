"""Settings of the reclaim engine: watermarks, eviction mode, soft-pin TTLs, batch sizes.

The names follow Mooncake's master flags (`--eviction-high-watermark-ratio`, `--eviction-ratio`,
`--allow-evict-soft-pinned-objects`, `--default-kv-soft-pin-ttl`, `--max-kv-soft-pin-ttl`) so that
the master's CLI can map its flags onto this dataclass one to one; `--eviction-mode` is ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvpool.errors import InvalidParams

__all__ = ["EvictionMode", "ReclaimConfig"]


class EvictionMode(Enum):
    """What evicting a replica means (seed 001, "先把 evict 的语义说对")."""

    CACHE = "cache"
    """Mooncake's semantics: drop the replica; soft-pinned objects last, if allowed at all."""
    POOL = "pool"
    """Unified memory pool: move the object out of this memory, never lose it. Droppable
    (non-primary, not soft-pinned) replicas are dropped; the rest are swapped out first."""


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
    default_soft_pin_ttl_s: float = 30 * 60.0
    """`--default-kv-soft-pin-ttl`, seconds: the TTL of ENABLE without one."""
    max_soft_pin_ttl_s: float = 24 * 3600.0
    """`--max-kv-soft-pin-ttl`, seconds: a longer requested TTL is INVALID_PARAMS."""
    isolate_batch: int = 32
    """Records isolated per critical section; bounds how long one holds up the online path."""
    inactive_ratio: float = 1.0
    """kswapd demotes from active while active bytes exceed this times inactive bytes (Linux's
    inactive_ratio): 1.0 keeps at least half of the resident bytes where new objects prove
    themselves."""
    kswapd_step_bytes: int = 64 << 20
    """Bytes one kswapd step reclaims at most before yielding to the event loop."""

    def __post_init__(self) -> None:
        if not 0.0 < self.high_watermark_ratio <= 1.0:
            raise InvalidParams(
                f"eviction_high_watermark_ratio must be in (0, 1], got {self.high_watermark_ratio}"
            )
        if not 0.0 <= self.eviction_ratio < 1.0:
            raise InvalidParams(f"eviction_ratio must be in [0, 1), got {self.eviction_ratio}")
        if self.default_soft_pin_ttl_s < 0 or self.max_soft_pin_ttl_s < 0:
            raise InvalidParams(
                f"soft pin TTLs must be >= 0, got default {self.default_soft_pin_ttl_s} s, "
                f"max {self.max_soft_pin_ttl_s} s"
            )
        if self.default_soft_pin_ttl_s > self.max_soft_pin_ttl_s:
            raise InvalidParams(
                f"default_kv_soft_pin_ttl {self.default_soft_pin_ttl_s} s exceeds "
                f"max_kv_soft_pin_ttl {self.max_soft_pin_ttl_s} s"
            )
        if self.isolate_batch < 1:
            raise InvalidParams(f"isolate_batch must be >= 1, got {self.isolate_batch}")
        if self.inactive_ratio <= 0:
            raise InvalidParams(f"inactive_ratio must be > 0, got {self.inactive_ratio}")
        if self.kswapd_step_bytes < 1:
            raise InvalidParams(f"kswapd_step_bytes must be >= 1, got {self.kswapd_step_bytes}")

    @property
    def low_watermark_ratio(self) -> float:
        """Where kswapd stops: high watermark minus eviction ratio (never below 0)."""
        return max(0.0, self.high_watermark_ratio - self.eviction_ratio)
