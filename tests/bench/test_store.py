"""`kvpool bench store --quick` runs end to end, verifies its data and writes its rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvpool.bench.rows import RATE_FIELDS

FIELDS = RATE_FIELDS


def test_quick_store_benchmark_writes_every_case(tmp_path: Path) -> None:
    out = tmp_path / "store.json"
    args = [sys.executable, "-m", "kvpool", "bench", "store", "--quick", "--segment-size", "256MiB"]
    proc = subprocess.run(
        [*args, "--json", str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert all(set(r) >= FIELDS for r in rows)
    cases = {
        (r["path"], r["op"], r["value_size"], r["batch"]) for r in rows if r["system"] == "kvpool"
    }
    for path in ("shm", "tcp"):
        for op in ("put", "get"):
            for size, batch in ((4096, 1), (4096, 64), (1 << 20, 1), (16 << 20, 1)):
                assert (path, op, size, batch) in cases
    limits = {r["path"] for r in rows if r["system"] == "limit"}
    assert limits == {"memcpy", "socket", "rpc"}
    assert all(r["ops_per_s"] > 0 for r in rows)
    assert "ratio" in proc.stdout  # the table
