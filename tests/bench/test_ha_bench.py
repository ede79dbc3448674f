"""`kvpool bench ha` runs end to end against a real etcd and real masters: four modes side by
side, a failover through a Store at etcd:// that loses no acknowledged put, and the snapshot
pause (it never asserts a speed)."""

from __future__ import annotations

import pytest

from kvpool.bench import ha
from kvpool.bench.master import Plan
from kvtest.procs import require_binary


def test_ha_benchmark_measures_four_modes_a_failover_and_a_snapshot() -> None:
    if ha.find_etcd() is None:
        require_binary("etcd")  # skips, or fails under KVPOOL_REQUIRE_SERVICES=1
    plan = ha.HaPlan(Plan(single_ops=100, batch_reqs=5, repeats=1, memory_objects=0), 1, 5_000, 2)
    rows = ha.run(plan)
    speed = [r for r in rows if r["metric"] == "throughput"]
    assert {(r["mode"], r["op"]) for r in speed} == {
        (mode, op)
        for mode in ("off", "data-dir", "standby", "ack-leader")
        for op in ("put", "batch_put", "get_replica_list", "batch_get_replica_list")
    }
    for r in speed:
        assert r["keys_per_s"] > 0 and r["p99_us"] >= r["p50_us"] > 0
        assert r["vs_off"] > 0
    (failover,) = [r for r in rows if r["metric"] == "failover_s"]
    assert 0 < failover["value"] < 30
    (checks,) = [r for r in rows if r["metric"] == "failover_checks"]
    assert checks["acked"] > 50
    assert checks["lost_acked"] == 0 and checks["wrong_bytes"] == 0
    (snap,) = [r for r in rows if r["metric"] == "snapshot_pause_ms"]
    assert snap["objects"] == 5_000 and snap["value"] > 0
    table = ha.format_table(rows)
    assert "standby" in table and "failover" in table and "snapshot pause" in table


@pytest.mark.parametrize("quick", [True, False])
def test_plans_measure_a_million_objects_in_the_full_run(quick: bool) -> None:
    plan = ha.HaPlan.of(quick)
    assert plan.snapshot_objects == (100_000 if quick else 1_000_000)
    assert plan.failovers == (1 if quick else 3)
