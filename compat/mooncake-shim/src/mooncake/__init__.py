"""`mooncake`, as provided by kvpool-mooncake-shim: Mooncake's module names on kvpool.

`mooncake.store` is `kvpool.compat.mooncake`; `mooncake.mooncake_config` holds `MooncakeConfig`.
Nothing here is Mooncake's code. See the kvpool repository's docs/compat.md.
"""

from __future__ import annotations

__kvpool_shim__ = True
"""Marks this package as the shim (the shim's build checks for it before refusing)."""
