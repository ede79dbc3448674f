"""`kvpool bench ha`: what keeping the master's metadata costs, and how fast a pool recovers.

One run, four masters side by side, measured in interleaved rounds (median round reported):

* `off`: a plain `kvpool master`;
* `data-dir`: `--data-dir` (operation log + snapshots on local disk);
* `standby`: `--ha etcd://...` with one standby following the leader's log (the leader answers a
  write after the standby has its records: `--ha-ack standby`, the default), against a private
  etcd (`kvpool.bench.etcd`);
* `ack-leader`: the same with `--ha-ack leader` (the leader answers at once; the standby follows
  a moment later).

Cases against each (the master benchmark's, `kvpool.bench.master`): single put lock-step
(PutStart + PutEnd: p50/p99 of the pair), 64-key batch puts pipelined (keys/s), single
GetReplicaList lock-step, 64-key batch gets pipelined. Each row's `vs_off` is its rate against
the `off` master's in the same run; for the lock-step put, `p50_vs_off` too.

Then, with etcd:

* `{"metric": "failover_s"}`: a Store at `etcd://.../CLUSTER` puts 4 KiB values in a loop; the
  leader is SIGKILLed; the time from the kill to the first put that completes afterwards (so
  through the new leader). The killed master comes back as a standby before the next repeat.
  Every put acknowledged before, during and after is read back and compared byte for byte
  (`lost_acked`, `wrong_bytes`: both must be 0).
* `{"metric": "snapshot_pause_ms"}`: in process, a master service with a data directory and N
  objects (1,000,000; `--quick` 100,000): the loop's pause of `Durability.snapshot()` (log
  rotation + fork), median of 3.

Without etcd installed the `standby` and failover rows are left out, and the run says so.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from kvpool.bench.etcd import LocalEtcd, find_etcd
from kvpool.bench.master import (
    BATCH,
    BATCH_WINDOW,
    WRITER,
    Case,
    Plan,
    _expect,
    _keys,
    _lockstep,
    _Master,
    _pipelined,
    _put_case,
)
from kvpool.bench.rows import Column, percentile, render_table, write_json
from kvpool.children import Child, free_port
from kvpool.protocol import messages as m

__all__ = ["HaPlan", "command", "run"]

CLUSTER = "benchha"
OBJECT = 4096


@dataclass(frozen=True, slots=True)
class HaPlan:
    master: Plan
    failovers: int
    snapshot_objects: int
    ttl: int | None
    """The masters' etcd lease TTL (whole seconds; None: the master's default)."""

    @staticmethod
    def of(quick: bool) -> HaPlan:
        if quick:
            return HaPlan(Plan.of(True), 1, 100_000, None)
        return HaPlan(Plan.of(False), 3, 1_000_000, None)


def _ha_args(
    etcd: str, port: int, member: str, ttl: int | None, *, ack: str, cluster: str
) -> list[str]:
    args = ["--ha", f"etcd://{etcd}/{cluster}", "--advertise", f"127.0.0.1:{port}"]
    args += ["--ha-ack", ack]
    args += ["--member-id", member]
    if ttl is not None:
        args += ["--ha-lease-ttl", str(ttl)]
    return args


def _leader(
    etcd: str, timeout: float, newer_than: int = 0, cluster: str = CLUSTER
) -> tuple[str, int]:
    """The (address, term) of the cluster's leader, once one with a term above `newer_than`
    leads."""
    from kvpool.ha import ClusterKeys, EtcdGateway, LeaderDiscovery

    coord = EtcdGateway([etcd])
    try:
        disc = LeaderDiscovery(coord, ClusterKeys(cluster))
        deadline = time.monotonic() + timeout
        while True:
            view = disc.resolve()
            if view is not None and view.term > newer_than:
                return view.address, view.term
            if time.monotonic() > deadline:
                raise TimeoutError(f"no leader of term > {newer_than} within {timeout} s")
            time.sleep(0.02)
    finally:
        coord.close()


class _Pair:
    """Two HA masters (leader and standby) on fixed loopback ports."""

    def __init__(
        self, etcd: str, ttl: int | None, cluster: str = CLUSTER, ack: str = "standby"
    ) -> None:
        self.etcd = etcd
        self.ttl = ttl
        self.cluster = cluster
        self.ack = ack
        self.ports = [free_port(), free_port()]
        self.procs: list[Child | None] = [None, None]
        self.leader_master: _Master | None = None
        try:
            first = self._start(0)
            self.term = _leader(etcd, 60, 0, cluster)[1]
            del first
            self._start(1)
        except BaseException:
            self.close()
            raise

    def _start(self, i: int) -> Child:
        port = self.ports[i]
        args = [
            sys.executable,
            "-m",
            "kvpool",
            "master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--client-ttl",
            "1h",
            "--no-reclaim",
            *_ha_args(self.etcd, port, f"m{i}", self.ttl, ack=self.ack, cluster=self.cluster),
        ]
        child = Child(args, name=f"kvpool master m{i} (bench ha)")
        self.procs[i] = child
        return child

    def leader_index(self, address: str) -> int:
        return self.ports.index(int(address.rsplit(":", 1)[1]))

    def close(self) -> None:
        for c in self.procs:
            if c is not None:
                c.stop(grace=10.0)
        self.procs = [None, None]


class _Attached:
    """A client of the HA pair's leader with the benchmark's segment mounted (the pair owns the
    processes)."""

    def __init__(self, address: str, cluster: str = CLUSTER) -> None:
        from kvpool.bench.master import HOST, NODE, SEGMENT, SEGMENT_SIZE
        from kvpool.rpc.client import RpcClient

        self.rpc = RpcClient(
            address, response_type=m.Response, cluster_id=cluster, timeout=120, client_name="bench"
        )
        info = m.SegmentInfo(SEGMENT, SEGMENT_SIZE, HOST, "127.0.0.1:1", "")
        try:
            reply = self.rpc.call(m.MountSegment(NODE, HOST, info))
        except BaseException:
            self.rpc.close()
            raise
        _expect(reply.code == 0, f"mount failed: {reply}")

    @classmethod
    def to_leader(cls, etcd: str, cluster: str, timeout: float) -> _Attached:
        """Attached to the cluster's leader: the one etcd names may still be taking office
        (it answers NOT_LEADER until it leads), so ask again until `timeout`."""
        from kvpool.errors import NotLeader

        deadline = time.monotonic() + timeout
        while True:
            address, _ = _leader(etcd, timeout, 0, cluster)
            try:
                return cls(address, cluster)
            except NotLeader:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        self.rpc.close()


def _wait_standby(rpc: Any, timeout: float) -> None:
    """Until the leader says a standby follows it (its Stats' `standbys`)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = rpc.call(m.Stats())
        if getattr(stats, "standbys", 0) >= 1:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("no standby caught up with the leader")
        time.sleep(0.05)


def _cases(plan: Plan, rpc: Any) -> list[tuple[str, str, int, Case]]:
    n = max(plan.single_ops, BATCH * plan.batch_reqs)
    keys = _keys("ha-read", n)
    for i in range(0, n, 1000):
        chunk = keys[i : i + 1000]
        started = rpc.call(m.BatchPutStart(WRITER, chunk, [OBJECT] * len(chunk)))
        _expect(all(r.code == 0 for r in started.results), "setup puts")
        ended = rpc.call(m.BatchPutEnd(WRITER, chunk, [7] * len(chunk)))
        _expect(ended.codes == [0] * len(chunk), "setup put ends")

    def check_get(i: int, reply: Any) -> None:
        _expect(reply.code == 0 and reply.checksum == 7, f"get: {reply}")

    def check_batch(i: int, reply: Any) -> None:
        _expect(all(r.code == 0 for r in reply.results), "batch get")

    gets = [m.GetReplicaList(keys[i % n]) for i in range(plan.single_ops)]
    batches = [
        m.BatchGetReplicaList(keys[(i * BATCH) % n : (i * BATCH) % n + BATCH])
        for i in range(plan.batch_reqs)
    ]
    return [
        ("put", "lockstep", 1, _put_case(plan, False, 1)),
        ("batch_put", "pipelined", BATCH, _put_case(plan, True, BATCH)),
        ("get_replica_list", "lockstep", 1, _lockstep(gets, check_get)),
        (
            "batch_get_replica_list",
            "pipelined",
            BATCH,
            _pipelined(batches, check_batch, BATCH_WINDOW),
        ),
    ]


def _throughput(plan: HaPlan, etcd: str | None, log: Callable[[str], None]) -> list[dict[str, Any]]:
    masters: dict[str, _Master | _Attached] = {}
    pairs: list[_Pair] = []
    data_dir = tempfile.mkdtemp(prefix="kvpool-bench-ha-")
    try:
        masters["off"] = _Master(False)
        masters["data-dir"] = _Master(False, data_dir)
        if etcd is not None:
            for mode, ack in (("standby", "standby"), ("ack-leader", "leader")):
                cluster = f"{CLUSTER}-{ack}"
                pairs.append(_Pair(etcd, plan.ttl, cluster, ack))
                masters[mode] = _Attached.to_leader(etcd, cluster, 60)
                _wait_standby(masters[mode].rpc, 60)
        cases = {mode: _cases(plan.master, mm.rpc) for mode, mm in masters.items()}
        results: dict[tuple[str, str], list[tuple[float, list[float]]]] = {}
        for rnd in range(plan.master.repeats):
            for i in range(4):
                for mode, mm in masters.items():
                    op, _case, batch, fn = cases[mode][i]
                    keys_done, seconds, lat = fn(mm.rpc, rnd)
                    keys = keys_done * batch if op == "batch_get_replica_list" else keys_done
                    results.setdefault((mode, op), []).append((keys / seconds, lat))
                    log(f"round {rnd + 1}: {mode:8} {op:22} {keys / seconds:12,.0f} keys/s")
    finally:
        for mm in masters.values():
            mm.close()
        for pair in pairs:
            pair.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    rows: list[dict[str, Any]] = []
    base: dict[str, tuple[float, float]] = {}
    for (mode, op), runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        lat = [x for _, xs in runs for x in xs]
        p50 = percentile(lat, 0.5) * 1e6
        if mode == "off":
            base[op] = (rate, p50)
        rows.append(
            {
                "metric": "throughput",
                "mode": mode,
                "op": op,
                "keys_per_s": rate,
                "p50_us": p50,
                "p99_us": percentile(lat, 0.99) * 1e6,
            }
        )
    for row in rows:
        rate0, p0 = base[row["op"]]
        row["vs_off"] = row["keys_per_s"] / rate0 if rate0 else 0.0
        row["p50_vs_off"] = row["p50_us"] / p0 if p0 else 0.0
    return rows


def _failover(plan: HaPlan, etcd: str, log: Callable[[str], None]) -> list[dict[str, Any]]:
    from kvpool.client.store import Store

    pair = _Pair(etcd, plan.ttl)
    rows: list[dict[str, Any]] = []
    try:
        address, term = _leader(etcd, 60)
        store = Store(
            master=f"etcd://{etcd}/{CLUSTER}",
            segment_size="512MB",
            cluster_id=CLUSTER,
        )
        try:
            acked: dict[str, bytes] = {}
            times: list[float] = []
            stop = threading.Event()
            errors: list[str] = []

            def writer() -> None:
                i = 0
                while not stop.is_set():
                    key = f"failover-{i}"
                    value = (key.encode() * (OBJECT // len(key) + 1))[:OBJECT]
                    try:
                        store.put(key, value)
                    except Exception as exc:  # counted: a failed put is not acknowledged
                        if len(errors) < 3 or len(errors) % 1000 == 0:
                            log(f"put {key} failed at {time.monotonic():.2f}: {exc}")
                        errors.append(f"{key}: {exc}")
                    else:
                        acked[key] = value
                        times.append(time.monotonic())
                    i += 1

            thread = threading.Thread(target=writer, name="bench-ha-writer", daemon=True)
            thread.start()
            try:
                for rep in range(plan.failovers):
                    _leader_wait_standby(address)
                    deadline = time.monotonic() + 30
                    while len(times) < 50 and time.monotonic() < deadline:
                        time.sleep(0.01)
                    i = pair.leader_index(address)
                    victim = pair.procs[i]
                    assert victim is not None
                    t0 = time.monotonic()
                    log(f"killing the leader {address} at {t0:.2f}")
                    victim.kill9()
                    t_dead = time.monotonic()
                    n0 = len(times)
                    deadline = time.monotonic() + 60
                    while not any(t > t_dead for t in times[n0:]) and time.monotonic() < deadline:
                        time.sleep(0.005)
                    after = [t for t in times[n0:] if t > t_dead]
                    failover = (min(after) - t0) if after else float("inf")
                    address, term = _leader(etcd, 60, term)
                    log(f"failover {rep + 1}/{plan.failovers}: {failover:.2f} s (term {term})")
                    rows.append({"metric": "failover_s", "value": failover, "repeat": rep + 1})
                    pair._start(i)  # the killed master comes back as a standby
            finally:
                stop.set()
                thread.join(timeout=60)
            lost = wrong = 0
            for key, value in acked.items():
                try:
                    got = store.get(key)
                except Exception as exc:
                    if not lost:
                        log(f"first lost key {key}: {exc!r}")
                    lost += 1
                    continue
                if got != value:
                    wrong += 1
            rows.append(
                {
                    "metric": "failover_checks",
                    "acked": len(acked),
                    "lost_acked": lost,
                    "wrong_bytes": wrong,
                    "failed_puts": len(errors),
                }
            )
        finally:
            store.close()
    finally:
        pair.close()
    values = [r["value"] for r in rows if r["metric"] == "failover_s"]
    if len(values) > 1:  # and the median of the runs (`repeat` 0)
        rows.append({"metric": "failover_s", "value": statistics.median(values), "repeat": 0})
    return rows


def _leader_wait_standby(address: str) -> None:
    from kvpool.rpc.client import RpcClient

    with RpcClient(address, response_type=m.Response, cluster_id=CLUSTER, timeout=10) as rpc:
        _wait_standby(rpc, 60)


def _snapshot_pause(n: int, log: Callable[[str], None]) -> dict[str, Any]:
    from kvpool.master.config import MasterConfig
    from kvpool.master.service import MasterService

    d = tempfile.mkdtemp(prefix="kvpool-bench-snapshot-")
    svc = None
    try:
        svc = MasterService(MasterConfig(data_dir=d, client_ttl=3600, seed=1))
        info = m.SegmentInfo(m.SegmentName("s"), 64 << 30, m.HostId("h"), "127.0.0.1:1", "")
        svc.handle(m.MountSegment(m.ClientId("n"), m.HostId("h"), info))
        durable = svc.durable
        assert durable is not None
        for i in range(0, n, 1000):
            keys = [f"key-{j:026d}" for j in range(i, min(n, i + 1000))]
            svc.handle(m.BatchPutStart(WRITER, keys, [OBJECT] * len(keys)))
            svc.handle(m.BatchPutEnd(WRITER, keys, [7] * len(keys)))
            durable.log.flush()
        gc.freeze()  # as the master's monitor does every second
        pauses = []
        for _ in range(3):
            durable.log.sync()
            t = time.perf_counter()
            _expect(durable.snapshot(), "a snapshot child already ran")
            pauses.append((time.perf_counter() - t) * 1e3)
            while not durable.poll():
                time.sleep(0.005)
        log(f"snapshot pause at {n:,} objects: {', '.join(f'{p:.1f}' for p in pauses)} ms")
        return {"metric": "snapshot_pause_ms", "value": statistics.median(pauses), "objects": n}
    finally:
        if svc is not None and svc.durable is not None:
            svc.durable.close()
        gc.unfreeze()
        shutil.rmtree(d, ignore_errors=True)


def run(plan: HaPlan, log: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """Every row of the benchmark (see the module docstring)."""
    binary = find_etcd()
    if binary is None:
        log("etcd is not installed (apt-get install etcd-server): no standby or failover rows")
        rows = _throughput(plan, None, log)
    else:
        with LocalEtcd(binary) as etcd:
            rows = _throughput(plan, etcd.endpoint, log)
            rows += _failover(plan, etcd.endpoint, log)
    rows.append(_snapshot_pause(plan.snapshot_objects, log))
    return rows


_COLUMNS = [
    Column("mode", "<9", lambda r: r["mode"]),
    Column("op", "<23", lambda r: r["op"]),
    Column("keys/s", ">10", lambda r: f"{r['keys_per_s']:,.0f}"),
    Column("vs off", ">7", lambda r: f"{r['vs_off']:.2f}x"),
    Column("p50 µs", ">8", lambda r: f"{r['p50_us']:,.1f}"),
    Column("p50 vs off", ">10", lambda r: f"{r['p50_vs_off']:.2f}x"),
    Column("p99 µs", ">9", lambda r: f"{r['p99_us']:,.1f}"),
]


def format_table(rows: list[dict[str, Any]]) -> str:
    table = render_table(_COLUMNS, [r for r in rows if r["metric"] == "throughput"])
    other = []
    for r in rows:
        if r["metric"] == "failover_s":
            which = "median" if r["repeat"] == 0 else f"run {r['repeat']}"
            other.append(f"failover ({which}): {r['value']:.2f} s")
        elif r["metric"] == "failover_checks":
            other.append(
                f"acknowledged puts {r['acked']:,}: lost {r['lost_acked']}, wrong bytes "
                f"{r['wrong_bytes']}, failed (not acknowledged) {r['failed_puts']}"
            )
        elif r["metric"] == "snapshot_pause_ms":
            other.append(f"snapshot pause at {r['objects']:,} objects: {r['value']:.1f} ms")
    return "\n".join([table, *other])


@click.command()
@click.option("--quick", is_flag=True, help="Smaller cases, one failover, 100k objects.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write rows here.")
@click.option(
    "--lease-ttl",
    type=click.IntRange(2, 60),
    help="The masters' etcd lease TTL in seconds (default: the master's own default).",
)
def command(quick: bool, json_path: str | None, lease_ttl: int | None) -> None:
    """HA off vs --data-dir vs one standby; failover time; snapshot pause."""
    plan = HaPlan.of(quick)
    if lease_ttl is not None:
        plan = HaPlan(plan.master, plan.failovers, plan.snapshot_objects, lease_ttl)
    rows = run(plan, log=lambda s: click.echo(s, err=True))
    click.echo(format_table(rows))
    if json_path:
        click.echo(f"wrote {write_json(json_path, rows)} rows to {json_path}")
