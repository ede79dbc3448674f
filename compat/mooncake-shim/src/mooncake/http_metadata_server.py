"""`mooncake.http_metadata_server` on kvpool: a no-op that logs why kvpool needs no metadata
server (kvpool.compat.mooncake_metadata)."""

from __future__ import annotations

import sys

from kvpool.compat.mooncake_metadata import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
