"""`kvpool bench master --quick` runs end to end, checks every reply, and writes its rows and the
memory metric (it never asserts a speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_quick_master_benchmark_writes_rows_and_the_memory_metric(tmp_path: Path) -> None:
    out = tmp_path / "master.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/master.py", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    speed = [r for r in rows if "metric" not in r]
    cases = {(r["op"], r["case"]) for r in speed}
    for op in ("echo", "get_replica_list", "put", "batch_get_replica_list", "batch_put"):
        assert (op, "lockstep") in cases and (op, "pipelined") in cases, op
    for r in speed:
        for field in ("system", "path", "op", "value_size", "batch", "ops_per_s", "bytes_per_s"):
            assert field in r
        assert r["ops_per_s"] > 0 and r["p50_us"] > 0 and r["p99_us"] >= r["p50_us"]
        assert r["master_cpu_us_per_key"] >= 0
    assert {r["batch"] for r in speed} == {1, 64}
    grl = next(r for r in speed if r["op"] == "get_replica_list" and r["case"] == "lockstep")
    assert grl["baseline"] == "echo lockstep" and grl["ratio"] > 0
    mem = [r for r in rows if r.get("metric") == "master_bytes_per_object"]
    assert sorted(r["reclaim"] for r in mem) == [False, True]
    assert all(r["objects"] == 20_000 and r["value"] > 0 for r in mem)
    assert "master us/key" in proc.stdout and "bytes of RSS per object" in proc.stdout


def test_lockstep_rounds_measure_only_the_interleaved_get_to_echo_ratio(tmp_path: Path) -> None:
    out = tmp_path / "lockstep.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvpool",
            "bench",
            "master",
            "--quick",
            "--lockstep-rounds",
            "3",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())
    assert row["metric"] == "lockstep_get_vs_echo" and row["rounds"] == 3
    assert len(row["ratios"]) == 3 and row["value"] > 0 and row["reclaim"] is True
    assert "interleaved rounds" in proc.stdout
