"""Store put/get benchmark, the same as `kvpool bench store`.

python benchmarks/store.py [--quick] [--json FILE] [--protocol auto|tcp] [--segment-size 1GiB]
"""

from __future__ import annotations

from kvpool.bench.store import command

if __name__ == "__main__":
    command()
