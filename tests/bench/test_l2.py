"""`kvpool bench l2 --quick` runs in seconds, writes the JSON rows every benchmark writes, and fails on wrong bytes."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvpool.bench.l2 import command
from kvpool.bench.rows import RATE_FIELDS


def test_quick_bench_writes_verified_rows_for_each_adapter_and_op(tmp_path: Path) -> None:
    out = tmp_path / "l2.json"
    result = CliRunner().invoke(
        command,
        [
            "--quick",
            "--json",
            str(out),
            "--adapter",
            json.dumps({"type": "fs", "base_path": str(tmp_path / "fs")}),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    required = RATE_FIELDS
    assert all(required <= set(r) for r in rows)
    ops = {(r["path"], r["op"]) for r in rows}
    assert {("fs", op) for op in ("store", "lookup", "load", "sm_store", "sm_prefetch")} <= ops
    assert ("memcpy", "copy") in ops
    assert all(r["verified"] for r in rows)
    assert "sm_prefetch" in result.output


def test_bench_exits_1_when_loads_come_back_wrong() -> None:
    broken = {"type": "fault", "inner": {"type": "mock"}, "seed": 1, "load_failure_rate": 1.0}
    result = CliRunner().invoke(command, ["--quick", "--adapter", json.dumps(broken)])
    assert result.exit_code == 1
    assert "VERIFY FAILED" in result.output


def test_bad_adapter_json_is_a_usage_error() -> None:
    result = CliRunner().invoke(command, ["--quick", "--adapter", '{"type": "nosuch"}'])
    assert result.exit_code == 2
