"""kvpool next to Mooncake, Redis and the physical limits: the same as `kvpool bench compare`.

    .venv/bin/python benchmarks/compare.py --json compare.json --plot docs/perf-compare.png

All options are those of `kvpool bench compare --help`; this script exists so that the
benchmark can be run from a checkout without the `kvpool` entry point installed.
"""

from __future__ import annotations

from kvpool.bench.compare import command

if __name__ == "__main__":
    command(prog_name="benchmarks/compare.py")
