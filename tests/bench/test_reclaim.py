"""`kvpool bench reclaim --quick` runs, checks its own data, and writes the documented rows."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvpool.bench.reclaim import command, make_trace, run_kvpool, run_lease_lru, run_lru


def test_quick_benchmark_writes_every_metric_row(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    result = CliRunner().invoke(command, ["--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    by_metric: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        assert isinstance(row["value"], float)
        by_metric.setdefault(str(row["metric"]), []).append(row)
    hits = {r["system"]: r["value"] for r in by_metric["hot_hit_ratio"]}
    assert set(hits) == {"kvpool", "lru", "lease_lru"}
    assert all(0.0 <= float(v) <= 1.0 for v in hits.values())  # type: ignore[arg-type]
    resident = sorted(r["resident_objects"] for r in by_metric["evict_us_per_object"])
    assert resident == [5_000, 50_000]  # --quick; the full run adds 1M
    puts = {(r["system"], r["pressure"]) for r in by_metric["put_p99_us"]}
    assert puts == {(s, p) for s in ("kvpool", "kvpool-master") for p in (True, False)}
    for metric in ("put_p99_us", "direct_put_p99_us", "kswapd_step_p99_us"):
        assert all(float(r["cpu_p99_us"]) > 0 for r in by_metric[metric])  # type: ignore[arg-type]
    assert "kvpool/lru" in result.output


def test_the_trace_scans_three_capacities_of_new_keys_once_each() -> None:
    trace = make_trace(1000, 0.8, seed=3)
    scans = [k for k in trace.keys if k.startswith("s")]
    assert len(scans) == 3000 and len(set(scans)) == 3000
    hot = {k for k in trace.keys if k.startswith("h")}
    assert len(hot) <= 300
    assert all(k.startswith("h") for k in trace.keys[: trace.warm])


def test_baselines_behave_as_their_definitions() -> None:
    trace = make_trace(1000, 0.8, seed=3)
    # With room for everything, LRU and the engine miss only keys never seen before...
    big = run_lru(trace, 10_000)
    assert big > 0.99 and run_kvpool(trace, 10_000) == big
    # ...and the lease-ordered one with no lease protection is never better than LRU.
    assert run_lease_lru(trace, 1000, lease_ops=0) <= run_lru(trace, 1000)
