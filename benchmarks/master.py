"""Master control-plane benchmark (same as `kvpool bench master`): python benchmarks/master.py [--quick] [--json FILE]."""

from __future__ import annotations

from kvpool.bench.master import command

if __name__ == "__main__":
    command()
