"""The RPC echo benchmark (`kvpool.bench.rpc`, tests/bench/bench_rpc.py) runs in --quick mode,
checks every reply and writes the benchmark rows of docs/performance.md."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.bench.rows import RATE_FIELDS, percentile
from kvpool.bench.rpc import (
    CASES,
    TRANSPORT_CASES,
    BenchSpec,
    lockstep_by_transport,
    median_rows,
    run_cases,
)
from kvpool.errors import InvalidParams
from kvpool.rpc.thread import ServerThread
from kvtest.procs import Proc
from rpc.rpc_testkit import CLUSTER, Add, Response, Sum, make_server, server_thread

SCRIPT = Path(__file__).with_name("bench_rpc.py")
ROW_FIELDS = RATE_FIELDS


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """The RPC tests' service (tests/rpc/rpc_testkit.py) in a background thread."""
    st = server_thread()
    try:
        yield st
    finally:
        st.stop()


def test_quick_benchmark_writes_rows(tmp_path: Path) -> None:
    out = tmp_path / "rpc.json"
    with Proc([sys.executable, str(SCRIPT), "--quick", "--json", str(out)], name="bench") as p:
        assert p.popen.wait(timeout=120) == 0, p.output()
    rows = json.loads(out.read_text())
    cases = [r["case"] for r in rows]
    assert cases == [*CASES, "readerthread-lockstep", "readerthread-threads", *TRANSPORT_CASES]
    assert [r["path"] for r in rows][-2:] == ["tcp", "unix"]
    assert {r["path"] for r in rows[:-1]} == {"tcp"}
    for r in rows:
        assert set(r) >= ROW_FIELDS, r
        assert r["system"] == "kvpool" and r["op"] == "echo" and r["value_size"] == 100
        assert r["ops_per_s"] > 0 and 0 < r["p50_us"] <= r["p99_us"]


def test_a_wrong_reply_fails_the_benchmark(server: ServerThread) -> None:
    def check(i: int, reply: object) -> None:
        if reply != Sum(i + 1):
            raise AssertionError(f"{i}: {reply}")

    spec = BenchSpec(
        endpoint=server.endpoint,
        response_type=Response,
        make_request=lambda i: Add(i, 2),  # answers i + 2: every check must fail
        check=check,
        cluster_id=CLUSTER,
        n=10,
    )
    for case in CASES:
        with pytest.raises(AssertionError):
            run_cases(spec, (case,))
    with pytest.raises(AssertionError):
        lockstep_by_transport(spec)


def _add_spec(endpoint: str, n: int = 50) -> BenchSpec:
    def check(i: int, reply: object) -> None:
        if reply != Sum(i + 2):
            raise AssertionError(f"{i}: {reply}")

    return BenchSpec(
        endpoint=endpoint,
        response_type=Response,
        make_request=lambda i: Add(i, 2),
        check=check,
        cluster_id=CLUSTER,
        n=n,
    )


def test_lockstep_by_transport_measures_both_and_labels_what_it_used(
    server: ServerThread,
) -> None:
    rows = lockstep_by_transport(_add_spec(server.endpoint), rounds=3)
    assert [(r["case"], r["path"], r["calls"]) for r in rows] == [
        ("lockstep-tcp", "tcp", 50),
        ("lockstep-unix", "unix", 50),
    ]
    assert all(r["ops_per_s"] > 0 for r in rows)
    with ServerThread(make_server(unix=False)) as tcp_only:
        rows = lockstep_by_transport(_add_spec(tcp_only.endpoint), rounds=3)
        assert [r["path"] for r in rows] == ["tcp", "tcp"]  # never labelled unix
    with pytest.raises(InvalidParams):
        lockstep_by_transport(_add_spec(server.endpoint), rounds=0)


def test_bench_spec_and_helpers_validate() -> None:
    with pytest.raises(InvalidParams):
        BenchSpec(endpoint="h:1", response_type=int, make_request=str, check=print, n=0)
    spec = BenchSpec(endpoint="h:1", response_type=int, make_request=str, check=print)
    with pytest.raises(InvalidParams):
        run_cases(spec, ("no-such-case",))
    assert percentile([], 0.5) == 0.0
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0
    runs = [[{"case": "a", "ops_per_s": v}] for v in (3.0, 1.0, 2.0)]
    assert median_rows(runs) == [{"case": "a", "ops_per_s": 2.0, "repeats": 3}]
