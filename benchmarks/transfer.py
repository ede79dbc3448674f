"""Data-plane bandwidth benchmark: `python benchmarks/transfer.py [--quick] [--json FILE]`.

The same as `kvpool bench transfer`; the code lives in `kvpool.bench.transfer`.
"""

from kvpool.bench.transfer import command

if __name__ == "__main__":
    command()
