"""`kvpool bench transfer --quick` runs end to end, verifies data, and writes the rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_quick_benchmark_writes_rows_for_every_path(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvpool",
            "bench",
            "transfer",
            "--quick",
            "--sizes",
            "4KiB,1MiB",
            "--json",
            str(out),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    keys = {"system", "path", "op", "value_size", "batch", "ops_per_s", "bytes_per_s"}
    keys |= {"p50_us", "p99_us"}
    assert all(keys <= set(r) for r in rows)
    seen = {(r["system"], r["path"], r["op"], r["value_size"]) for r in rows}
    for size in (4096, 1 << 20):
        for op in ("read", "write"):
            for system, path in (("kvpool", "shm"), ("kvpool", "tcp")):
                assert (system, path, op, size) in seen
            for path in ("memcpy", "socket"):
                assert ("limit", path, op, size) in seen
    assert all(r["bytes_per_s"] > 0 and r["p99_us"] >= r["p50_us"] for r in rows)
    singles = [r for r in rows if r["path"] in ("shm", "tcp") and r["batch"] == 1]
    assert all("ratio_to_baseline" in r for r in singles)
    batches = {(r["path"], r["op"]) for r in rows if r["batch"] == 64}
    assert batches == {("shm", "read"), ("shm", "write"), ("tcp", "read"), ("tcp", "write")}
    assert "vs limit" in proc.stdout


def test_thin_script_runs_the_same_command() -> None:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "transfer.py"), "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--quick" in proc.stdout
