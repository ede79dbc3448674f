"""`mooncake.cli_client` on kvpool: the `mooncake_client` command, the per-host standalone
client that `setup_dummy` attaches to (kvpool.compat.mooncake_client)."""

from __future__ import annotations

import sys

from kvpool.compat.mooncake_client import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
