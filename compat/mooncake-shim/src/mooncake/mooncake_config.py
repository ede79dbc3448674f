"""`mooncake.mooncake_config` on kvpool: `MooncakeConfig` reads the same MOONCAKE_* variables."""

from __future__ import annotations

from kvpool.compat.mooncake.config import (
    DEFAULT_GLOBAL_SEGMENT_SIZE,
    DEFAULT_LOCAL_BUFFER_SIZE,
    MooncakeConfig,
)

__all__ = ["DEFAULT_GLOBAL_SEGMENT_SIZE", "DEFAULT_LOCAL_BUFFER_SIZE", "MooncakeConfig"]
