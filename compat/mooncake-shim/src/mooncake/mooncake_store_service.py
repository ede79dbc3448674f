"""`mooncake.mooncake_store_service` on kvpool: Mooncake's REST store service, same routes and
answers (kvpool.compat.mooncake_service)."""

from __future__ import annotations

import sys

from kvpool.compat.mooncake_service import main


def sync_main() -> int:
    """The `mc_store_rest_server` console script, as in Mooncake's wheel."""
    return main()


__all__ = ["main", "sync_main"]

if __name__ == "__main__":
    sys.exit(main())
