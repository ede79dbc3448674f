"""Store put/get benchmark (same as `kvpool bench store`): python benchmarks/store.py [--quick] [--json FILE]."""

from __future__ import annotations

from kvpool.bench.store import command

if __name__ == "__main__":
    command()
