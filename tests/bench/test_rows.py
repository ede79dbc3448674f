"""`kvpool.bench.rows`: the one row type, percentile, median, table and JSON of the benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kvpool.bench.rows import Column, Row, median_row, percentile, render_table, write_json

COMMON = {"system", "path", "op", "value_size", "batch", "ops_per_s", "bytes_per_s"}
COMMON |= {"p50_us", "p99_us"}


def _row(ops: float, **extra: object) -> Row:
    return Row("kvpool", "shm", "put", 4096, 1, ops, ops * 4096, 10.0, 20.0, extra=dict(extra))


def test_percentile_interpolates_like_numpy_in_any_order() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([4, 1, 3, 2], 0.5) == 2.5  # the median of an even count
    samples = list(np.random.default_rng(1).exponential(size=1001))
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        assert abs(percentile(samples, q) - float(np.percentile(samples, q * 100))) < 1e-12


def test_median_row_keeps_one_whole_row() -> None:
    runs = [_row(3.0, run=0), _row(1.0, run=1), _row(2.0, run=2), _row(4.0, run=3)]
    chosen = median_row(runs, lambda r: r.ops_per_s)
    assert chosen is runs[2]  # the low median of an even count is a real row


def test_json_form_has_the_common_fields_then_the_extras(tmp_path: Path) -> None:
    r = _row(100.0, case="lockstep", verified=True)
    r.ratio, r.baseline = 0.5, "memcpy"
    out = r.to_json()
    assert set(out) >= COMMON
    assert (out["ratio"], out["baseline"], out["case"], out["verified"]) == (
        0.5,
        "memcpy",
        "lockstep",
        True,
    )
    path = tmp_path / "rows.json"
    metric = {"system": "kvpool", "metric": "master_bytes_per_object", "value": 1.5}
    assert write_json(str(path), [r, metric]) == 2
    assert json.loads(path.read_text()) == [out, metric]


def test_table_aligns_columns_under_a_rule() -> None:
    cols = (
        Column("op", "<5", lambda r: r.op),
        Column("ops/s", ">7", lambda r: f"{r.ops_per_s:.0f}"),
    )
    assert render_table(cols, [_row(1234.4)]).splitlines() == [
        "op      ops/s",
        "-------------",
        "put      1234",
    ]
