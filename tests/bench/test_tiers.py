"""`kvpool bench tiers --quick`: memory and disk-tier rows beside the file baseline, every disk
read checked, and every object readable with the data at 8x the memory."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvpool.cli import main

MiB = 1 << 20


def test_quick_tiers_bench_reports_every_path_and_reads_everything_beyond_ram(
    tmp_path: Path,
) -> None:
    out = tmp_path / "tiers.json"
    result = CliRunner().invoke(
        main, ["bench", "tiers", "--quick", "--json", str(out), "--dir", str(tmp_path)]
    )
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    rows = json.loads(out.read_text())
    rates = {(r["system"], r["path"], r["op"], r["value_size"]) for r in rows if "op" in r}
    for size in (MiB, 16 * MiB):
        for key in (
            ("limit", "file", "get", size),
            ("limit", "file", "put", size),
            ("kvpool", "memory", "get", size),
            ("kvpool", "disk-local", "get", size),
            ("kvpool", "disk-shm", "get", size),
            ("kvpool", "disk-tcp", "get", size),
            ("limit", "file+tcp", "get", size),
        ):
            assert key in rates, key
    # Every kvpool row says how it read: strict (GetReplicaList per get) or cached (remembered
    # places); the disk and DFS gets are measured both ways, each with its ratio to the file.
    assert all(
        r["mode"] in ("strict", "cached") for r in rows if r["system"] == "kvpool" and "op" in r
    )
    modes = {(r["path"], r["op"], r["value_size"], r.get("mode")): r for r in rows if "op" in r}
    for size in (MiB, 16 * MiB):
        for path in ("disk-local", "disk-shm", "disk-tcp", "dfs"):
            for op in ("get", "get_into"):
                for mode in ("strict", "cached"):
                    assert modes[(path, op, size, mode)]["ratio"] > 0, (path, op, size, mode)
                    # TCP reads also against a file served over a loopback socket, same run.
                    socket_ratio = modes[(path, op, size, mode)].get("x_socket")
                    assert (socket_ratio is not None and socket_ratio > 0) == (path == "disk-tcp")
    # Promotion on hit: the re-read hot set came back to memory (within the phase's deadline).
    metrics = {r["metric"]: r["value"] for r in rows if "metric" in r}
    assert 0 < metrics["promotion_seconds"] < 60
    assert metrics["promotion_rounds"] >= 1
    assert metrics["promoted_get_vs_memory"] > 0 and metrics["disk_get_vs_memory"] > 0
    (cap,) = [r for r in rows if r.get("metric") == "objects_beyond_ram_readable"]
    assert cap["value"] == 1.0
    assert cap["data_bytes"] == 8 * cap["memory_bytes"]
    assert not list(tmp_path.glob("kvpool-bench-tiers-*"))  # cleaned up
