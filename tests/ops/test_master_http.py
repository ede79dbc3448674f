"""The master's metrics and admin API against a live pool (a real master and node processes)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from kvpool import Store
from kvpool.errors import ObjectNotFound
from kvtest.ops_http import http_base, samples
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.procs import kvpool_proc, wait_until


def http_address(p: Pool) -> str:
    return http_base(p.master)


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read()
            status = r.status
            ctype = r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        body, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    if ctype.startswith("application/json"):
        return status, json.loads(body)
    return status, body.decode()


def scrape(base: str) -> dict[str, float]:
    status, text = get(base + "/metrics")
    assert status == 200
    return samples(text)


@pytest.fixture(scope="module")
def live(pool_module: PoolFactory) -> tuple[Pool, str]:  # noqa: F811
    p = pool_module(nodes=1, segment_size="8MiB", master_args=("--http-port", "0"))
    return p, http_address(p)


def test_counters_move_by_exactly_the_workload(live: tuple[Pool, str]) -> None:
    p, base = live
    before = scrape(base)
    with Store(p.address) as store:
        for i in range(25):
            store.put(f"exact-{i}", bytes([i]) * 4096)
        for i in range(17):
            assert store.get(f"exact-{i}") == bytes([i]) * 4096
        with pytest.raises(ObjectNotFound):
            store.get("exact-missing")
        after = scrape(base)
    puts = after["master_put_commit_requests_total"] - before.get(
        "master_put_commit_requests_total", 0
    )
    puts += after.get("master_put_start_requests_total", 0) - before.get(
        "master_put_start_requests_total", 0
    )
    assert puts == 25
    gets = after["master_get_replica_list_requests_total"] - before.get(
        "master_get_replica_list_requests_total", 0
    )
    assert gets == 18
    misses = after["master_get_replica_list_failures_total"] - before.get(
        "master_get_replica_list_failures_total", 0
    )
    assert misses == 1
    assert after["master_key_count"] - before["master_key_count"] == 25
    assert after["master_allocated_bytes"] - before["master_allocated_bytes"] >= 25 * 4096
    assert (
        after['kvpool_master_requests_total{op="get_replica_list"}']
        == after["master_get_replica_list_requests_total"]
    )
    count = after['kvpool_master_request_seconds_count{op="get_replica_list"}']
    # One request in 16 of each kind is timed (the 16th, 32nd, ...).
    assert count == after["master_get_replica_list_requests_total"] // 16
    assert after["master_total_capacity_bytes"] == 8 * 1024 * 1024
    assert after["master_active_clients"] >= 1


def test_evictions_account_for_every_key_that_left(live: tuple[Pool, str]) -> None:
    p, base = live
    before = scrape(base)
    n = 60
    with Store(p.address) as store:
        for i in range(n):  # 60 x 256 KiB into 8 MiB: reclaim must evict
            store.put(f"evict-{i}", b"e" * (256 * 1024))
        after = scrape(base)
        present = sum(1 for i in range(n) if store.exists(f"evict-{i}"))
    evicted = after["master_successful_evictions_total"] - before.get(
        "master_successful_evictions_total", 0
    )
    assert evicted > 0
    assert present < n
    # Every key that left the index was an eviction, counted once (no removes were sent).
    assert before["master_key_count"] + n - after["master_key_count"] == evicted
    assert (
        after["master_evicted_key_count_total"] - before.get("master_evicted_key_count_total", 0)
        == evicted
    )
    assert after["master_evicted_size_bytes_total"] > before.get(
        "master_evicted_size_bytes_total", 0
    )


def test_admin_endpoints_answer_json(live: tuple[Pool, str]) -> None:
    p, base = live
    with Store(p.address) as store:
        store.put("admin-key", b"a" * 1000)
    assert get(base + "/health") == (200, get(base + "/health")[1])
    assert get(base + "/health")[1]["status"] == "ok"
    assert get(base + "/role")[1]["role"] == "single"
    status, obj = get(base + "/query_key?key=admin-key")
    assert status == 200
    assert obj["size"] == 1000
    assert obj["replicas"][0]["status"] == "COMPLETE"
    assert obj["replicas"][0]["tier"] == "memory"
    assert obj["hard_pin"] is False
    status, segs = get(base + "/get_all_segments")
    assert status == 200 and len(segs["segments"]) == 1
    status, st = get(base + "/api/v1/segments/status")
    (seg,) = st["segments"]
    assert seg["state"] == "serving" and seg["capacity"] == 8 * 1024 * 1024
    assert seg["used"] + seg["free"] == seg["capacity"]
    status, tenants = get(base + "/api/v1/tenants")
    assert status == 200
    assert tenants["tenants"][0]["tenant"] == "default"
    assert tenants["tenants"][0]["objects"] >= 1
    status, stats = get(base + "/api/v1/stats")
    assert status == 200 and stats["segments"][0]["name"] == seg["name"]


def test_get_all_keys_pages_through_every_key_once(live: tuple[Pool, str]) -> None:
    p, base = live
    with Store(p.address) as store:
        for i in range(30):
            store.put(f"page-{i}", b"p")
        status, first = get(base + "/get_all_keys?limit=10000")
        expected = set(first["keys"])
        assert {f"page-{i}" for i in range(30)} <= expected
        seen: list[str] = []
        after = ""
        for _ in range(1000):
            status, page = get(base + f"/get_all_keys?limit=7&after={after}")
            assert status == 200 and len(page["keys"]) <= 7
            seen.extend(page["keys"])
            if page["next"] is None:
                break
            after = page["next"]
    assert sorted(seen) == sorted(expected)
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/query_key", 400),
        ("/query_key?key=", 400),
        ("/query_key?key=nope", 404),
        ("/query_key?key=a&key=b", 400),
        ("/query_key?key=" + "k" * 5000, 400),
        ("/get_all_keys?limit=0", 400),
        ("/get_all_keys?limit=abc", 400),
        ("/get_all_keys?limit=99999999", 400),
        ("/get_all_keys?after=garbage", 400),
        ("/get_all_keys?after=999999.0", 400),
        ("/no/such/path", 404),
    ],
)
def test_bad_parameters_answer_4xx_json(live: tuple[Pool, str], path: str, status: int) -> None:
    _, base = live
    got, body = get(base + path)
    assert got == status
    assert isinstance(body, dict) and body["error"]


def test_post_on_a_get_path_is_405(live: tuple[Pool, str]) -> None:
    _, base = live
    req = urllib.request.Request(base + "/health", method="POST", data=b"")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 405


def test_status_watch_refreshes_until_stopped(live: tuple[Pool, str]) -> None:
    p, _ = live
    proc = kvpool_proc("status", "--master", p.address, "--watch", "--interval", "0.2", "--json")
    try:
        wait_until(lambda: sum(1 for line in proc.lines if '"uptime_s"' in line) >= 3, timeout=30)
    finally:
        proc.stop()


def test_connections_past_the_cap_are_answered_503(live: tuple[Pool, str]) -> None:
    import socket

    from kvpool.ops.http import MAX_CONNECTIONS

    _, base = live
    host, port = base.removeprefix("http://").split(":")
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        # Each held connection is being served (waiting for its request head): one more is
        # refused at once with a 503 ...
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            assert extra.recv(100).startswith(b"HTTP/1.1 503")
    finally:
        for s in held:
            s.close()
    # ... and once they are gone, requests are served again.
    wait_until(lambda: get(base + "/health")[0] == 200, timeout=10)
