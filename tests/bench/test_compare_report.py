"""The table, the targets and the JSON of `kvpool bench compare`, from hand-made measurements."""

from __future__ import annotations

from kvpool.bench.peers.report import (
    Skipped,
    json_rows,
    render_markdown,
    render_table,
    render_targets,
)
from kvpool.bench.peers.workload import Measurement, case_name, size_name


def m(
    system: str, path: str, op: str, size: int, ops: float, batch: int = 1, p50: float = 0.0
) -> Measurement:
    return Measurement(
        system=system,
        path=path,
        op=op,
        value_size=size,
        batch=batch,
        ops_per_s=ops,
        bytes_per_s=ops * size,
        p50_us=p50 or 1e6 / ops,
        p99_us=2 * (p50 or 1e6 / ops),
        rounds=5,
        calls=100,
        api=f"{system}-{op}",
    )


RESULTS = [
    m("kvpool", "shm", "get", 1 << 20, 3000),
    m("kvpool", "tcp", "get", 1 << 20, 900),
    m("mooncake", "tcp", "get", 1 << 20, 500, p50=1000),  # a noisy run: mean 2 ms, median 1
    m("limit", "memcpy", "get", 1 << 20, 10000),
    m("limit", "socket", "get", 1 << 20, 1000),
    m("redis", "tcp", "get", 1 << 20, 1500),
]


def test_sizes_and_cases_read_as_people_write_them() -> None:
    assert [size_name(n) for n in (4096, 1 << 20, 16 << 20, 1000)] == [
        "4 KiB",
        "1 MiB",
        "16 MiB",
        "1000 B",
    ]
    assert case_name(4096, 64) == "64 x 4 KiB"


def test_table_shows_kvpool_over_each_peer_and_the_skipped_systems() -> None:
    table = render_table(RESULTS, [Skipped("mooncake/tcp", "no wheel", "pip install x")])
    mooncake = next(line for line in table.splitlines() if "mooncake/tcp" in line)
    # by throughput 3000/500 and 900/500; by p50 1000 us over 333 us and over 1111 us
    assert mooncake.split()[-6:] == ["6.00", "/", "3.00", "1.80", "/", "0.90"]
    assert "skipped: mooncake/tcp: no wheel; install: pip install x" in table


def test_targets_say_met_or_missed_with_the_worst_ratio() -> None:
    text = render_targets(RESULTS)
    assert "kvpool/Mooncake, >= 1 MiB >= 3.0: met (lowest 6.00 at get 1 MiB; by p50 met" in text
    assert "kvpool shm / memcpy, >= 1 MiB >= 0.7: MISSED (lowest 0.30" in text
    assert "kvpool tcp / raw socket, >= 1 MiB >= 0.7: met (lowest 0.90" in text
    assert "kvpool/Mooncake, small single ops >= 1.5: not measured" in text


def test_json_rows_have_the_design_fields_and_ratio_rows_name_their_peer() -> None:
    rows = json_rows(RESULTS)
    plain = [r for r in rows if "metric" not in r]
    assert len(plain) == len(RESULTS)
    assert plain[0] == {
        "system": "kvpool",
        "path": "shm",
        "op": "get",
        "value_size": 1 << 20,
        "batch": 1,
        "ops_per_s": 3000,
        "bytes_per_s": 3000 * (1 << 20),
        "p50_us": 1e6 / 3000,
        "p99_us": 2e6 / 3000,
        "rounds": 5,
        "calls": 100,
        "api": "kvpool-get",
    }
    ratios = {(r["path"], r["peer"]): r["value"] for r in rows if r.get("metric") == "ratio"}
    assert ratios[("shm", "mooncake/tcp")] == 6.0
    by_p50 = {(r["path"], r["peer"]): r["value_p50"] for r in rows if r.get("metric") == "ratio"}
    assert round(by_p50[("shm", "mooncake/tcp")], 6) == 3.0
    assert ratios[("tcp", "limit/socket")] == 0.9
    assert len(ratios) == 2 * 4  # both kvpool paths against the four other rows


def test_markdown_table_bolds_kvpool_and_lists_what_was_skipped() -> None:
    md = render_markdown(
        RESULTS, [Skipped("redis/tcp", "no server", "apt-get install redis-server")]
    )
    lines = md.splitlines()
    assert lines[0].startswith("| op | case | system/path | api | ops/s | GB/s | p50 µs |")
    assert (
        "| get | 1 MiB | **kvpool/shm** | `kvpool-get` | 3000 | 3.146 | 333 | 667 |  |  |" in lines
    )
    mooncake = "| get | 1 MiB | mooncake/tcp | `mooncake-get` | 500 | 0.524 | 1000 | 2000 |"
    assert mooncake + " 6.00 / 3.00 | 1.80 / 0.90 |" in lines
    assert "Skipped: redis/tcp: no server (install: `apt-get install redis-server`)" in md


def test_every_kvpool_row_names_its_mode_and_the_fast_rows_have_their_targets() -> None:
    def moded(path: str, op: str, ops: float, mode: str) -> Measurement:
        got = m("kvpool", path, op, 4096, ops)
        got.mode = mode
        return got

    results = [
        moded("shm", "get", 100_000, "strict"),
        moded("shm+fast", "get", 300_000, "cached"),
        m("redis", "unix", "get", 4096, 100_000),
    ]
    rows = json_rows(results)
    kv = [r for r in rows if r["system"] == "kvpool" and "metric" not in r]
    assert {(r["path"], r["mode"]) for r in kv} == {("shm", "strict"), ("shm+fast", "cached")}
    ratios = {(r["path"], r["mode"]): r["value"] for r in rows if r.get("metric") == "ratio"}
    assert ratios == {("shm", "strict"): 1.0, ("shm+fast", "cached"): 3.0}
    assert "mode" not in next(r for r in rows if r["system"] == "redis")
    targets = render_targets(results)
    assert "fast/Redis unix, small single gets >= 2.0: met (lowest 3.00" in targets
    assert "kvpool/Redis over a Unix socket, every row >= 1.0: met (lowest 1.00" in targets
