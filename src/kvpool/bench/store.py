"""`kvpool bench store`: put/get through the whole client, next to the limits of this machine.

Setup: the embedded pool (a master and one `kvpool node`, child processes), so the data lives in
*another process's* segment on this host; this process is one client. Every case runs twice:
with `protocol="auto"` (the engine maps the node's shared memory: path "shm") and with TCP forced
(the node's transfer server over loopback: path "tcp").

Cases: 4 KiB single put/get, 4 KiB in batches of 64, 1 MiB and 16 MiB (zero-copy `put_from` /
`get_into` from registered buffers). Each reports ops/s, bytes/s and p50/p99 latency per call.

Baselines measured in the same run, so that ratios mean something on a noisy shared machine:
memcpy between touched memory (numpy; for a put from the caller's buffer into fresh slices of
256 MiB, for a get from fresh slices into the caller's buffer), a raw loopback TCP socket (sendall → recv_into, the best any
TCP transfer could do), each measured alternately with the 1 MiB / 16 MiB calls it is compared
with, and an `Echo` round trip to the master (the floor of any operation that needs one RPC).

Cached read mode (issue 18): the staleness window of another client's removal as seen by a
cached-mode reader (`staleness_row`), and TCP gets of a skewed (Zipf) workload in strict mode,
cached mode and cached mode with a hot cache, with its hit ratio (`hot_cache_rows`). These rows
carry `"mode"`.

Every value read is compared with what was written; the benchmark never asserts a speed.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
import numpy as np

from kvpool.bench.rows import Column, Row, percentile, render_table, write_json
from kvpool.client.embedded import EmbeddedPool, PoolSpec
from kvpool.client.store import Store
from kvpool.config import format_size, parse_size
from kvpool.errors import ErrorCode, KVPoolError
from kvpool.protocol.messages import Echo

__all__ = ["command", "median_of_runs", "run"]

KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Plan:
    """How many calls each case makes."""

    small_ops: int
    batches: int
    mib_ops: int
    big_ops: int
    baseline_reps: int

    @staticmethod
    def of(quick: bool) -> Plan:
        if quick:
            return Plan(small_ops=200, batches=10, mib_ops=10, big_ops=4, baseline_reps=5)
        return Plan(small_ops=3000, batches=150, mib_ops=300, big_ops=40, baseline_reps=30)


def _row(
    path: str, op: str, size: int, batch: int, samples_s: list[float], *, system: str = "kvpool"
) -> Row:
    # Rates come from the median call, not the mean: on a shared machine a few calls stall
    # for milliseconds behind someone else's work, and the median is what the code does.
    calls = len(samples_s)
    p50 = statistics.median(samples_s)
    ops = batch / p50 if p50 > 0 else 0.0
    total = sum(samples_s)
    return Row(
        system=system,
        path=path,
        op=op,
        value_size=size,
        batch=batch,
        ops_per_s=ops,
        bytes_per_s=ops * size,
        p50_us=p50 * 1e6,
        p99_us=percentile(samples_s, 0.99) * 1e6,
        calls=calls,
        # Calls x batch / total time (the median-based ops_per_s is the headline).
        extra={"mean_ops_per_s": calls * batch / total if total > 0 else 0.0},
    )


def _timed(n: int, fn: Callable[[int], object]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


class DataMismatch(KVPoolError):
    """A value read back differs from what was written (the benchmark's only hard failure)."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise DataMismatch(f"data read back differs: {what}")


# ---------------------------------------------------------------- baselines


class Limits:
    """The physical limits, measured interleaved with the cases they are compared with.

    `memcpy(src)`: numpy.copyto of `src` into the next slice of a touched 256 MiB buffer (like
    a put into a pre-faulted segment; copying into the same slice every time would stay in the
    CPU caches). `socket(n)`: `n` bytes over a loopback TCP connection to a receiver thread
    (sendall → recv_into, then a one-byte ack), the best any TCP transfer could do. Both run
    alternately with the kvpool call they are the baseline of, so a busy moment of this shared
    machine slows both and their ratio stays meaningful.
    """

    def __init__(self, span: int = 256 * MiB, max_message: int = 16 * MiB) -> None:
        self._dst = np.ones(span, np.uint8)  # ones, not zeros: every page touched
        self._next = 0
        self._payload = b"\x01" * max_message
        self._lsock = socket.create_server(("127.0.0.1", 0))
        self._rx = threading.Thread(target=self._receive, name="bench-socket-rx", daemon=True)
        self._rx.start()
        self._conn = socket.create_connection(self._lsock.getsockname()[:2])
        self._conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _receive(self) -> None:
        conn, _ = self._lsock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            view = memoryview(bytearray(len(self._payload)))
            head = bytearray(8)
            while True:
                if conn.recv_into(head, 8, socket.MSG_WAITALL) != 8:
                    return
                size = int.from_bytes(head, "little")
                got = 0
                while got < size:
                    n = conn.recv_into(view[got:size], size - got)
                    if n == 0:
                        return
                    got += n
                conn.sendall(b"k")

    def _slice(self, n: int) -> np.ndarray[Any, Any]:
        if self._next + n > self._dst.nbytes:
            self._next = 0
        part = self._dst[self._next : self._next + n]
        self._next += n
        return part

    def memcpy(self, src: np.ndarray[Any, Any]) -> float:
        """A put's limit: the caller's (warm) buffer into the next slice of touched memory."""
        dst = self._slice(src.nbytes)
        t0 = time.perf_counter()
        np.copyto(dst, src)
        return time.perf_counter() - t0

    def memcpy_into(self, dst: np.ndarray[Any, Any]) -> float:
        """A get's limit: the next slice of touched memory (not in the CPU cache, like a
        replica) into the caller's (warm) buffer, the same buffer `get_into` fills."""
        src = self._slice(dst.nbytes)
        t0 = time.perf_counter()
        np.copyto(dst, src)
        return time.perf_counter() - t0

    def socket(self, n: int) -> float:
        t0 = time.perf_counter()
        self._conn.sendall(n.to_bytes(8, "little"))
        self._conn.sendall(memoryview(self._payload)[:n])
        if self._conn.recv(1) != b"k":
            raise KVPoolError("socket baseline: the receiver went away")
        return time.perf_counter() - t0

    def close(self) -> None:
        self._conn.close()
        self._rx.join(timeout=10)
        self._lsock.close()

    def rows(self, reps: int, size: int = 16 * MiB) -> list[Row]:
        src = np.ones(size, np.uint8)
        self.memcpy(src)
        self.socket(size)
        mem = [self.memcpy(src) for _ in range(max(reps, 16))]
        sock = [self.socket(size) for _ in range(reps)]
        return [
            _row("memcpy", "copy", size, 1, mem, system="limit"),
            _row("socket", "send", size, 1, sock, system="limit"),
        ]


def rpc_baseline(store: Store, reps: int) -> Row:
    rpc = store._node.rpc  # the Store's own connection: the same path its calls take
    rpc.call(Echo(b""))
    return _row("rpc", "echo", 0, 1, _timed(reps, lambda _: rpc.call(Echo(b""))), system="limit")


# ---------------------------------------------------------------- cases


def run_cases(store: Store, path: str, plan: Plan, limits: Limits) -> list[Row]:
    rows: list[Row] = []
    rng = np.random.default_rng(7)
    tag = f"bench-{path}"

    # 4 KiB single
    small = [rng.integers(0, 256, 4 * KiB, dtype=np.uint8).tobytes() for _ in range(16)]
    n = plan.small_ops
    rows.append(
        _row(path, "put", 4 * KiB, 1, _timed(n, lambda i: store.put(f"{tag}-s{i}", small[i % 16])))
    )
    got: list[Any] = [None]

    def get_small(i: int) -> None:
        got[0] = store.get(f"{tag}-s{i}")

    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        get_small(i)
        samples.append(time.perf_counter() - t0)
        _check(got[0] == small[i % 16], f"4 KiB get of {tag}-s{i}")
    rows.append(_row(path, "get", 4 * KiB, 1, samples))
    store.remove_all(force=True)

    # 4 KiB x 64 batches
    b = 64
    keys = [[f"{tag}-b{j}-{k}" for k in range(b)] for j in range(plan.batches)]
    vals = [small[k % 16] for k in range(b)]

    def bput(j: int) -> None:
        codes = store.batch_put(keys[j], vals)
        _check(all(c == ErrorCode.OK for c in codes), f"batch_put codes {set(codes)}")

    rows.append(_row(path, "put", 4 * KiB, b, _timed(plan.batches, bput)))
    samples = []
    for j in range(plan.batches):
        t0 = time.perf_counter()
        out = store.batch_get(keys[j])
        samples.append(time.perf_counter() - t0)
        _check(list(map(bytes, [o or b"" for o in out])) == vals, f"batch_get of batch {j}")
    rows.append(_row(path, "get", 4 * KiB, b, samples))
    store.remove_all(force=True)

    # 1 MiB and 16 MiB, zero-copy from / into registered buffers, each call alternating with
    # one measurement of its limit (memcpy for shm, the raw socket for tcp).
    for size, count in ((MiB, plan.mib_ops), (16 * MiB, plan.big_ops)):
        src = rng.integers(0, 256, size, dtype=np.uint8)
        dst = np.ones(size, np.uint8)  # ones, not zeros: touched before anything is timed
        store.register_buffer(src)
        store.register_buffer(dst)

        # Each direction's limit uses memory as warm as the call it is compared with: a put
        # copies the warm source into segment memory, a get copies segment memory into the
        # warm destination.
        def limit(s: int = size, a: np.ndarray[Any, Any] = src) -> float:
            return limits.memcpy(a) if path == "shm" else limits.socket(s)

        def limit_get(s: int = size, b: np.ndarray[Any, Any] = dst) -> float:
            return limits.memcpy_into(b) if path == "shm" else limits.socket(s)

        try:
            label = f"{tag}-{size}"
            put_s, put_base, get_s, get_base = [], [], [], []
            for i in range(count):
                put_base.append(limit())
                t0 = time.perf_counter()
                store.put_from(f"{label}-{i}", src)
                put_s.append(time.perf_counter() - t0)
            for i in range(count):
                get_base.append(limit_get())
                dst[:1] = 0
                t0 = time.perf_counter()
                store.get_into(f"{label}-{i}", dst)
                get_s.append(time.perf_counter() - t0)
                if i == 0 or i == count - 1:
                    _check(bool(np.array_equal(src, dst)), f"{size}-byte get_into")
            for op, samples, base in (("put", put_s, put_base), ("get", get_s, get_base)):
                r = _row(path, op, size, 1, samples)
                limit_bps = size / statistics.median(base)
                r.ratio = r.bytes_per_s / limit_bps
                name = "memcpy" if path == "shm" else "socket"
                r.baseline = f"{name} {limit_bps / 1e9:.2f} GB/s, interleaved"
                rows.append(r)
        finally:
            store.unregister_buffer(src)
            store.unregister_buffer(dst)
        store.remove_all(force=True)
    return rows


# ---------------------------------------------------------------- cached mode: staleness, hot cache


def staleness_row(address: str, trials: int) -> Row:
    """How long another client's removal stays visible to a cached-mode reader (issue 18): a
    strict Store puts a key, a cached Store reads it (so it remembers the place), the strict
    one removes it, and the reader reads again and again until it gets `ObjectNotFound`. The
    window runs from just before the Remove is sent to that answer; without the invalidation
    stream it would be the `location_ttl` (60 s here). Median and p99 of `trials`."""
    samples: list[float] = []
    with (
        Store(address, read_mode="cached", location_ttl=60.0) as reader,
        Store(address) as writer,
    ):
        for i in range(trials):
            key = f"stale-{i}"
            _check(writer.put(key, b"s" * 4096), f"put of {key}")
            _check(reader.get(key) == b"s" * 4096, f"first get of {key}")
            t0 = time.perf_counter()
            writer.remove(key, force=True)
            deadline = t0 + 5.0
            while True:
                try:
                    reader.get(key)
                except KVPoolError:
                    break
                _check(time.perf_counter() < deadline, f"{key} still read 5 s after its removal")
            samples.append(time.perf_counter() - t0)
    row = _row("shm", "staleness", 4 * KiB, 1, samples)
    row.extra["mode"] = "cached"
    row.baseline = "window from Remove sent to the reader's miss (TTL 60 s)"
    return row


def hot_cache_rows(address: str, gets: int, keys: int = 2000, size: int = 16 * KiB) -> list[Row]:
    """TCP gets of a skewed workload (Zipf, s = 1.2, over `keys` values of `size` bytes):
    strict mode, cached mode, and cached mode with a hot cache of a quarter of the data. Each
    row says its mode and the hot cache its hit ratio; ratios are to the strict row."""
    rng = np.random.default_rng(18)
    values = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(16)]
    ranks = np.arange(1, keys + 1, dtype=np.float64) ** -1.2
    picks = rng.choice(keys, size=gets, p=ranks / ranks.sum())
    rows: list[Row] = []
    with Store(address) as writer:
        names = [f"hot-{k}" for k in range(keys)]
        for j in range(0, keys, 100):
            codes = writer.batch_put(
                names[j : j + 100], [values[k % 16] for k in range(j, j + 100)]
            )
            _check(all(c == ErrorCode.OK for c in codes), "hot-cache fill")
        modes: tuple[tuple[str, dict[str, Any]], ...] = (
            ("strict", {}),
            ("cached", {"read_mode": "cached"}),
            ("cached+hot", {"read_mode": "cached", "hot_cache_size": keys * size // 4}),
        )
        for mode, kwargs in modes:
            with Store(address, protocol="tcp", location_ttl=60.0, **kwargs) as store:
                samples = []
                for k in picks:
                    t0 = time.perf_counter()
                    got = store.get(names[k])
                    samples.append(time.perf_counter() - t0)
                    _check(got == values[k % 16], f"skewed get of {names[k]}")
                row = _row("tcp", "get zipf", size, 1, samples)
                row.extra["mode"] = mode
                hot = store.hot_cache
                if hot is not None:
                    row.extra["hit_ratio"] = hot.hit_ratio
                    row.baseline = f"hot cache hit ratio {hot.hit_ratio:.2f}"
                rows.append(row)
        writer.remove_all(force=True)
    strict = rows[0].ops_per_s
    for r in rows[1:]:
        r.ratio = r.ops_per_s / strict if strict > 0 else None
        r.baseline = (r.baseline + "; " if r.baseline else "") + "ratio to strict tcp"
    return rows


def run(
    quick: bool = False,
    segment_size: int = 1 << 30,
    protocols: tuple[str, ...] = ("auto", "tcp"),
    master: str | None = None,
) -> list[Row]:
    """Run the benchmark; starts (and stops) an embedded pool unless `master` is given."""
    plan = Plan.of(quick)
    pool = EmbeddedPool(PoolSpec(segment_size=segment_size)) if master is None else None
    rows: list[Row] = []
    try:
        address = pool.start() if pool is not None else master
        assert address is not None
        limits = Limits()
        try:
            rows += limits.rows(plan.baseline_reps)
            cases: list[Row] = []
            rpcs: list[Row] = []
            for proto in protocols:
                path = "shm" if proto == "auto" else proto
                with Store(address, protocol=proto) as store:
                    store.warm_up()
                    rpcs.append(rpc_baseline(store, plan.small_ops))
                    cases += run_cases(store, path, plan, limits)
                    rpcs.append(rpc_baseline(store, plan.small_ops))
        finally:
            limits.close()
        # The faster of the echo runs is what single-key ratios are taken against
        # (conservative when the machine got busier meanwhile).
        rpc = max(rpcs, key=lambda r: r.ops_per_s)
        rows.append(rpc)
        for r in cases:
            if r.value_size < MiB and r.batch == 1:
                r.ratio = r.ops_per_s / rpc.ops_per_s
                r.baseline = f"rpc echo {rpc.ops_per_s / 1e3:.1f}k/s"
            rows.append(r)
        rows.append(staleness_row(address, 20 if quick else 300))
        rows += hot_cache_rows(address, 300 if quick else 5000)
    finally:
        if pool is not None:
            pool.close()
    return rows


def median_of_runs(runs: list[list[Row]]) -> list[Row]:
    """One row per case: the median rates and the median of the same-run ratios."""
    if len(runs) == 1:
        return runs[0]
    out = []
    for same in zip(*runs, strict=True):
        first = same[0]

        def med(f: Callable[[Row], float], rows: tuple[Row, ...] = same) -> float:
            return statistics.median(f(r) for r in rows)

        ratios = [r.ratio for r in same if r.ratio is not None]
        out.append(
            Row(
                system=first.system,
                path=first.path,
                op=first.op,
                value_size=first.value_size,
                batch=first.batch,
                ops_per_s=med(lambda r: r.ops_per_s),
                bytes_per_s=med(lambda r: r.bytes_per_s),
                p50_us=med(lambda r: r.p50_us),
                p99_us=med(lambda r: r.p99_us),
                calls=sum(r.calls for r in same),
                ratio=statistics.median(ratios) if ratios else None,
                baseline=(
                    f"{first.baseline.split(' ')[0]} row, same-run ratios, median of {len(same)}"
                    if first.baseline
                    else ""
                ),
                extra={
                    **first.extra,  # the mode
                    "mean_ops_per_s": med(lambda r: r.extra["mean_ops_per_s"]),
                    **(
                        {"hit_ratio": med(lambda r: r.extra["hit_ratio"])}
                        if "hit_ratio" in first.extra
                        else {}
                    ),
                },
            )
        )
    return out


_COLUMNS = (
    Column("system", "<7", lambda r: r.system),
    Column("path", "<7", lambda r: r.path),
    Column("op", "<9", lambda r: r.op),
    Column("mode", "<10", lambda r: r.extra.get("mode", "strict") if r.system == "kvpool" else ""),
    Column("size", ">9", lambda r: format_size(r.value_size)),
    Column("batch", ">5", lambda r: str(r.batch)),
    Column("ops/s", ">10", lambda r: f"{r.ops_per_s:.0f}"),
    Column("GB/s", ">7", lambda r: f"{r.bytes_per_s / 1e9:.2f}"),
    Column("p50 us", ">9", lambda r: f"{r.p50_us:.1f}"),
    Column("p99 us", ">9", lambda r: f"{r.p99_us:.1f}"),
    Column("ratio", ">6", lambda r: f"{r.ratio:.2f}" if r.ratio is not None else ""),
    Column(" baseline", "", lambda r: f" {r.baseline}"),
)


def format_table(rows: list[Row]) -> str:
    return render_table(_COLUMNS, rows)


@click.command()
@click.option("--quick", is_flag=True, help="A few calls per case (seconds; used by the tests).")
@click.option("--json", "json_path", default=None, help="Write the rows as JSON to this file.")
@click.option("--segment-size", default="1GiB", show_default=True, help="The node's segment.")
@click.option(
    "--protocol",
    "protocols",
    multiple=True,
    type=click.Choice(["auto", "tcp"]),
    help="Paths to measure (default: both).",
)
@click.option("--master", default=None, help="Use this running pool instead of starting one.")
@click.option("--repeat", default=1, show_default=True, help="Runs; report the median of each.")
def command(
    *,
    repeat: int,
    quick: bool,
    json_path: str | None,
    segment_size: str,
    protocols: tuple[str, ...],
    master: str | None,
) -> None:
    """Store put/get (4 KiB, 4 KiB x 64, 1 MiB, 16 MiB) over shm and TCP, with baselines."""
    size = parse_size(segment_size, name="--segment-size", minimum=64 * MiB)
    runs = [
        run(quick=quick, segment_size=size, protocols=protocols or ("auto", "tcp"), master=master)
        for _ in range(max(1, repeat))
    ]
    rows = median_of_runs(runs)
    click.echo(format_table(rows))
    if json_path:
        write_json(json_path, rows)
