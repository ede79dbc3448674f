"""Graceful drain against a live pool: pinned objects survive, nothing new lands on the segment."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from kvpool import ReplicateConfig, SoftPinAction, Store
from kvpool.errors import SegmentError
from kvtest.ops_http import http_base
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401
from kvtest.procs import run_kvpool, wait_until


def _http(p: Pool) -> str:
    return http_base(p.master)


def _get(url: str, method: str = "GET") -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _segments_of(base: str, key: str) -> list[str]:
    status, obj = _get(f"{base}/query_key?key={key}")
    assert status == 200, obj
    return [r["segment"] for r in obj["replicas"]]


def test_drain_moves_pinned_objects_out_and_places_nothing_new_there(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(
        nodes=2,
        segment_size="16MiB",
        master_args=("--http-port", "0", "--default-kv-lease-ttl", "500ms"),
    )
    base = _http(p)
    hard = ReplicateConfig(with_hard_pin=True)
    soft = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=600_000)
    with Store(p.address) as store:
        for i in range(40):
            store.put(f"hard-{i}", bytes([i]) * 20_000, hard)
            store.put(f"soft-{i}", bytes([i + 1]) * 20_000, soft)
            store.put(f"plain-{i}", bytes([i + 2]) * 20_000)
        _, st = _get(base + "/api/v1/segments/status")
        victim = max(st["segments"], key=lambda s: s["objects"])["name"]
        pinned_there = [
            k
            for k in [f"hard-{i}" for i in range(40)] + [f"soft-{i}" for i in range(40)]
            if victim in _segments_of(base, k)
        ]
        assert pinned_there, "the placement put no pinned object on the busier segment"

        status, prog = _get(f"{base}/api/v1/segments/drain?segment={victim}&grace=20s", "POST")
        assert status == 200, prog
        # While the drain runs, new puts go elsewhere (checked before the segment goes).
        during = []
        for i in range(30):
            key = f"during-{i}"
            store.put(key, b"d" * 20_000)
            assert victim not in _segments_of(base, key)
            during.append(key)
        # The CLI joins the drain under way and shows its progress until it ends.
        cli = run_kvpool("drain", "--master", p.address, "--segment", victim)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert " done " in cli.stdout.splitlines()[-1], cli.stdout

        status, prog = _get(f"{base}/api/v1/segments/drain?segment={victim}")
        assert status == 200
        assert prog["state"] == "done"
        assert prog["failed"] == 0
        assert prog["moved"] >= len(pinned_there)
        _, st = _get(base + "/api/v1/segments/status")
        assert victim not in [s["name"] for s in st["segments"]]

        for i in range(40):  # every pinned object is still there, bytes intact
            assert store.get(f"hard-{i}") == bytes([i]) * 20_000
            assert store.get(f"soft-{i}") == bytes([i + 1]) * 20_000
            assert victim not in _segments_of(base, f"hard-{i}")
        for key in during:
            assert store.get(key) == b"d" * 20_000


def test_drain_endpoints_refuse_bad_requests(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="8MiB", master_args=("--http-port", "0"))
    base = _http(p)
    assert _get(base + "/api/v1/segments/drain", "POST")[0] == 400
    assert _get(base + "/api/v1/segments/drain?segment=nope", "POST")[0] == 404
    _, st = _get(base + "/api/v1/segments/status")
    name = st["segments"][0]["name"]
    status, body = _get(f"{base}/api/v1/segments/drain?segment={name}&grace=soon", "POST")
    assert status == 400 and "grace" in body["error"]
    assert _get(base + "/api/v1/segments/drain?segment=nope")[0] == 404
    # An empty segment drains at once over HTTP.
    status, body = _get(f"{base}/api/v1/segments/drain?segment={name}&grace=5s", "POST")
    assert status == 200 and body["segment"] == name
    wait_until(
        lambda: _get(f"{base}/api/v1/segments/drain?segment={name}")[1]["state"] == "done",
        timeout=20,
    )


def test_a_node_stopped_with_sigterm_drains_its_pinned_objects_first(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(
        nodes=1,
        segment_size="16MiB",
        master_args=("--http-port", "0", "--default-kv-lease-ttl", "500ms"),
    )
    base = _http(p)
    leaving = p.add_node(None, "--drain-grace", "20s")
    _, st = _get(base + "/api/v1/segments/status")
    (seg,) = [s["name"] for s in st["segments"] if s["endpoint"] == p.node_endpoints[1]]
    there = ReplicateConfig(with_hard_pin=True, preferred_segments=(seg,))
    with Store(p.address) as store:
        for i in range(25):
            store.put(f"pinned-{i}", bytes([i]) * 30_000, there)
        assert all(_segments_of(base, f"pinned-{i}") == [seg] for i in range(25))
        assert p.stop_node(1) == 0
        out = "\n".join(leaving.lines)
        assert "moved 25 of 25 objects to keep, 0 failed" in out, out
        for i in range(25):
            assert store.get(f"pinned-{i}") == bytes([i]) * 30_000
            assert seg not in _segments_of(base, f"pinned-{i}")


def test_a_store_drains_its_own_segment_before_freeing_it(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="16MiB", master_args=("--default-kv-lease-ttl", "500ms"))
    with Store(p.address) as owner, Store(p.address) as reader:
        name = owner.mount_segment("16MiB")
        there = ReplicateConfig(with_hard_pin=True, preferred_segments=(name,))
        for i in range(20):
            owner.put(f"own-{i}", bytes([i]) * 10_000, there)
        reply = owner.drain_segment(name, grace=20)
        assert (reply.state, reply.must_keep, reply.moved, reply.failed) == ("done", 20, 20, 0)
        with pytest.raises(SegmentError):  # no longer this Store's: its memory is freed
            owner.unmount_segment(name)
        for i in range(20):
            assert reader.get(f"own-{i}") == bytes([i]) * 10_000


def test_the_cli_shows_a_drain_that_ended_before_it_asked(pool: PoolFactory) -> None:  # noqa: F811
    """The drain of an empty segment ends (and unmounts it) within a tick: `kvpool drain` asked
    afterwards shows that drain instead of failing with "no segment mounted"."""
    p = pool(nodes=2, segment_size="8MiB", master_args=("--http-port", "0"))
    base = _http(p)
    _, st = _get(base + "/api/v1/segments/status")
    victim = st["segments"][0]["name"]
    status, prog = _get(f"{base}/api/v1/segments/drain?segment={victim}&grace=0s", "POST")
    assert status == 200, prog
    wait_until(
        lambda: _get(f"{base}/api/v1/segments/drain?segment={victim}")[1]["state"] == "done",
        10,
        what="the drain of the empty segment to end",
    )
    cli = run_kvpool("drain", "--master", p.address, "--segment", victim)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert " done " in cli.stdout.splitlines()[-1], cli.stdout
    never = run_kvpool("drain", "--master", p.address, "--segment", "nope")
    assert never.returncode == 1 and "no segment 'nope' is mounted" in never.stderr
