"""`mooncake.cli` on kvpool: the `mooncake_master` command, Mooncake's flags on a kvpool master.

Mooncake's wheel runs its C++ master from here; the shim runs `kvpool master` with the same
flags, read with Mooncake's meaning (kvpool.cli.mooncake_master, docs/compat.md).
"""

from __future__ import annotations

import sys

from kvpool.cli.mooncake_master import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
