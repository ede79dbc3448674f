"""L2 adapter benchmark (same as `kvpool bench l2`): python benchmarks/l2.py [--quick] [--with-services] [--json FILE]."""

from __future__ import annotations

from kvpool.bench.l2 import command

if __name__ == "__main__":
    command()
