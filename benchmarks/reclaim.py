"""Reclaim benchmark: `python benchmarks/reclaim.py [--quick] [--json FILE]`.

The same as `kvpool bench reclaim`; the code lives in `kvpool.bench.reclaim`.
"""

from kvpool.bench.reclaim import command

if __name__ == "__main__":
    command()
