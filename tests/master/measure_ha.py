"""Measure the master's HA with real processes: the numbers of docs/parts/ha.md.

    PYTHONPATH=tests .venv/bin/python tests/master/measure_ha.py [--puts 3000] [--objects 100000]
        [--ttl 5] [--json FILE]

A private etcd (Debian's `etcd`), `kvpool master` processes on loopback, and a writer in this
process speaking the protocol (`kvtest.ha.FakeNode` registers a segment: no bytes move, so
this is the metadata path alone, which is what replication changes):

1. puts with HA off (a plain master), an HA leader alone, and an HA leader with one standby
   in sync: lock-step single puts (PutStart + PutEnd: p50 / p99 of the pair), lock-step
   64-key batches (BatchPutStart + BatchPutEnd), 8 writer threads of single puts and 4 of
   64-key batches (group commit: many writes wait on one ack);
2. failover: leader SIGKILL → the first successful put through the new leader (TTL `--ttl`);
3. promotion: with `--objects` objects in the standby's copy, the leader SIGKILLed: how long
   the standby's promotion took (its log line) and kill → first put.

Rows follow the benchmark format of design.md (`system`, `path`, `op`, `batch`, `ops_per_s`,
`p50_us`, `p99_us`; `metric` / `value` for the rest), for `kvpool bench ha` to reuse
(`run_all`). Not a test: it asserts only that every measured put succeeded.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpool.protocol.messages import (
    BatchPutEnd,
    BatchPutStart,
    BatchPutStartReply,
    BatchReply,
    ClientId,
    PutEnd,
    PutStart,
    PutStartReply,
    Reply,
    Response,
)
from kvpool.rpc.client import RpcClient
from kvtest.etcd import EtcdServer
from kvtest.ha import FakeNode, HaMaster, checksum, put, wait_leader
from kvtest.procs import Proc, free_port, kvpool_proc, wait_until

Row = dict[str, Any]


def _rpc(address: str, cluster: str) -> RpcClient:
    # TCP on purpose: the standby reaches its leader over TCP, and so do remote clients.
    return RpcClient(address, response_type=Response, cluster_id=cluster, timeout=10, unix=False)


def single_puts(address: str, cluster: str, client: ClientId, n: int, tag: str) -> list[float]:
    """Seconds per lock-step PutStart + PutEnd."""
    out = []
    with _rpc(address, cluster) as c:
        for i in range(n):
            key = f"{tag}-s{i}"
            t = time.perf_counter()
            start = c.call_as(PutStart(client, key, 4096), PutStartReply)
            end = c.call_as(PutEnd(client, key, checksum(key)), Reply)
            out.append(time.perf_counter() - t)
            assert start.code == 0 and end.code == 0, (start, end)
    return out


def batch_puts(address: str, cluster: str, client: ClientId, n: int, tag: str) -> float:
    """Keys per second of lock-step 64-key BatchPutStart + BatchPutEnd."""
    keys = [f"{tag}-b{i}" for i in range(n)]
    with _rpc(address, cluster) as c:
        t = time.perf_counter()
        for i in range(0, n, 64):
            part = keys[i : i + 64]
            s = c.call_as(BatchPutStart(client, part, [4096] * len(part)), BatchPutStartReply)
            e = c.call_as(BatchPutEnd(client, part, [checksum(k) for k in part]), BatchReply)
            assert all(r.code == 0 for r in s.results) and not any(e.codes)
        return n / (time.perf_counter() - t)


def threaded_puts(address: str, cluster: str, client: ClientId, n: int, tag: str) -> float:
    """Puts per second of 8 threads of lock-step single puts (n in all)."""
    per = n // 8

    def work(w: int) -> None:
        single_puts(address, cluster, client, per, f"{tag}-t{w}")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return per * 8 / (time.perf_counter() - t)


def threaded_batches(address: str, cluster: str, client: ClientId, n: int, tag: str) -> float:
    """Keys per second of 4 threads of lock-step 64-key batches (n keys in all)."""
    per = n // 4

    def work(w: int) -> None:
        batch_puts(address, cluster, client, per, f"{tag}-tb{w}")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return per * 4 / (time.perf_counter() - t)


def put_rows(system: str, address: str, cluster: str, client: ClientId, n: int) -> list[Row]:
    single_puts(address, cluster, client, 300, f"{system}-warm")
    lat = sorted(single_puts(address, cluster, client, n, system))
    p50 = statistics.median(lat) * 1e6
    p99 = lat[int(len(lat) * 0.99)] * 1e6
    batch = batch_puts(address, cluster, client, n * 4, system)
    threaded = threaded_puts(address, cluster, client, n, system)
    tbatch = threaded_batches(address, cluster, client, n * 4, system)
    base = {"system": system, "path": "tcp", "op": "put", "value_size": 4096}
    return [
        {**base, "batch": 1, "ops_per_s": 1e6 / p50, "p50_us": p50, "p99_us": p99},
        {**base, "batch": 64, "ops_per_s": batch, "p50_us": 0.0, "p99_us": 0.0},
        {**base, "batch": 1, "threads": 8, "ops_per_s": threaded, "p50_us": 0.0, "p99_us": 0.0},
        {**base, "batch": 64, "threads": 4, "ops_per_s": tbatch, "p50_us": 0.0, "p99_us": 0.0},
    ]


def _plain_master() -> tuple[Proc, str]:
    proc = kvpool_proc("master", "--port", "0", "--client-ttl", "30s", name="plain master")
    return proc, proc.wait_ready(timeout=30)


def run_all(
    work: Path, puts: int, objects: int, ttl: int, log: Callable[[str], None] = print
) -> list[Row]:
    rows: list[Row] = []
    etcd = EtcdServer(work / "etcd")
    etcd.start()
    procs: list[HaMaster] = []
    node: FakeNode | None = None
    try:
        proc, address = _plain_master()
        try:
            node = FakeNode(address, "kvpool", size=64 << 30)
            rows += put_rows("kvpool", address, "kvpool", node.client_id, puts)
        finally:
            node and node.close()
            proc.stop()
        # An HA leader alone, then with one standby (the same leader: measured after it syncs).
        cluster = f"measure-{free_port()}"
        procs.append(HaMaster(etcd.endpoint, cluster, "m1", ttl=ttl))
        leader = wait_leader(procs, timeout=30)
        node = FakeNode(leader.address, cluster, size=64 << 30)
        rows += put_rows("kvpool-ha-alone", leader.address, cluster, node.client_id, puts)
        procs.append(HaMaster(etcd.endpoint, cluster, "m2", ttl=ttl))
        standby = procs[1]
        wait_until(
            lambda: (s := leader.status()) is not None and s.standbys == ["m2"],
            60,
            what="the standby in sync",
        )
        rows += put_rows("kvpool-ha-standby", leader.address, cluster, node.client_id, puts)
        # Fill to `objects`, wait for the copy, kill the leader.
        have = leader.status()
        assert have is not None
        if objects > have.objects:
            batch_puts(leader.address, cluster, node.client_id, objects - have.objects, "fill")
        total = leader.status().objects  # type: ignore[union-attr]
        wait_until(
            lambda: (s := standby.status()) is not None and s.objects == total,
            120,
            what="the standby's copy to hold every object",
        )
        killed = time.monotonic()
        leader.proc.kill9()
        node.point(standby.address)
        first_put = 0.0
        while first_put == 0.0:
            try:
                with _rpc(standby.address, cluster) as c:
                    if node.remounts < 2:
                        node.mount()
                    put(c, node.client_id, f"after-{time.monotonic()}")
                first_put = time.monotonic() - killed
            except Exception:
                time.sleep(0.01)
        m = wait_until(
            lambda: next(
                (
                    x
                    for x in (
                        re.search(r"promotion took ([\d.]+) s", ln) for ln in standby.proc.lines
                    )
                    if x
                ),
                None,
            ),
            10,
            what="the promotion line",
        )
        promotion = float(m.group(1))
        log(f"{total} objects: promotion {promotion:.3f} s, kill -> first put {first_put:.2f} s")
        rows.append(
            {
                "system": "kvpool-ha-standby",
                "metric": "failover_s",
                "value": first_put,
                "ttl_s": ttl,
                "objects": total,
            }
        )
        rows.append(
            {
                "system": "kvpool-ha-standby",
                "metric": "promotion_s",
                "value": promotion,
                "objects": total,
            }
        )
    finally:
        if node is not None:
            node.close()
        for p in procs:
            p.stop()
        etcd.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--puts", type=int, default=3000)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--ttl", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rows = run_all(Path(d), args.puts, args.objects, args.ttl)
    for r in rows:
        if "metric" in r:
            print(f"{r['system']:20} {r['metric']:14} {r['value']:.3f}")
        else:
            extra = f" threads={r['threads']}" if "threads" in r else ""
            print(
                f"{r['system']:20} put batch={r['batch']:<3}{extra:11} {r['ops_per_s']:>10.0f}/s"
                f"  p50 {r['p50_us']:7.1f} us  p99 {r['p99_us']:7.1f} us"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
