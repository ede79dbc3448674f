"""`kvpool bench transfer`: data-plane bandwidth between two processes, next to its limits.

A child process (`python -m kvpool.transfer.serve --raw`) owns a segment and serves it; this
process reads and writes it (a) through shared memory and (b) through forced TCP over loopback,
and in the same run measures the physical baselines: numpy memcpy of the same sizes between two
pre-touched buffers, and a bare `sendall` → `recv_into` exchange with the child over one
loopback socket (lock-step, like a single `transfer()` call). Cases are interleaved round by
round, so a noisy neighbour hits system and baseline alike; each row reports the median
throughput over rounds, per-op p50/p99, and two ratios to its baseline: of the median per-op
times ("vs limit", robust to stalls) and of the median throughputs ("thru"). A third table shows where inline copying stops paying and the memcpy pool
starts (`submit()` of one local copy, inline vs handed to the pool thread).

Every path's bytes are verified (xxh3 of what was written, read back by both paths); the
benchmark never judges speed.
"""

from __future__ import annotations

import re
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import numpy as np
import xxhash

from kvpool.bench.rows import Column, Row, percentile, render_table, write_json
from kvpool.children import Child, ChildError
from kvpool.config import format_size, parse_size
from kvpool.transfer import (
    SegmentLocation,
    SegmentMemory,
    TransferEngine,
    TransferOp,
    TransferRequest,
)

__all__ = ["command", "run"]

_READY = re.compile(
    r"listening on (?P<endpoint>\S+) segment (?P<name>\S+) size (?P<size>\d+) "
    r"shm_path (?P<shm>\S+) host_id (?P<host>\S+) raw (?P<raw_host>\S+):(?P<raw_port>\d+)"
)
_RAW_CMD = struct.Struct("<cQ")


@dataclass
class _Case:
    system: str
    path: str
    op: str
    size: int
    run: Callable[[], None]
    batch: int = 1  # values per call
    rates: list[float] = field(default_factory=list)  # bytes/s, one per round
    lat_ns: list[int] = field(default_factory=list)


class _Peer:
    """The child process that owns the segment; stopped by closing its stdin."""

    def __init__(self, size: int) -> None:
        args = [sys.executable, "-m", "kvpool.transfer.serve", "--name", "bench"]
        args += ["--size", str(size), "--raw", "--watch-stdin"]
        self.proc = Child(args, name="transfer peer", stdin=True)
        self.raw: socket.socket | None = None
        try:
            m = self.proc.wait_line(_READY, timeout=60)
        except ChildError as exc:
            self.close()
            raise click.ClickException(f"transfer peer did not start: {exc}") from exc
        self.location = SegmentLocation(
            m["name"], int(m["size"]), m["host"], m["endpoint"], m["shm"]
        )
        self.raw = socket.create_connection((m["raw_host"], int(m["raw_port"])))
        self.raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        if self.raw is not None:
            self.raw.close()
        self.proc.stop(grace=10.0)


def _raw_read(sock: socket.socket, view: memoryview) -> None:
    n = view.nbytes
    sock.sendall(_RAW_CMD.pack(b"R", n))
    pos = 0
    while pos < n:
        got = sock.recv_into(view[pos:])
        if got == 0:
            raise ConnectionError("raw peer closed")
        pos += got


def _raw_write(sock: socket.socket, view: memoryview) -> None:
    sock.sendall(_RAW_CMD.pack(b"W", view.nbytes))
    sock.sendall(view)
    if sock.recv(1) != b"k":
        raise ConnectionError("raw peer did not acknowledge")


def _copier(src: memoryview, dst: memoryview) -> Callable[[], None]:
    a = np.frombuffer(src, dtype=np.uint8)
    b = np.frombuffer(dst, dtype=np.uint8)
    return lambda: np.copyto(b, a)


def _transferrer(eng: TransferEngine, reqs: list[TransferRequest]) -> Callable[[], None]:
    return lambda: eng.transfer(reqs)


def _raw(sock: socket.socket, op: str, view: memoryview) -> Callable[[], None]:
    if op == "read":
        return lambda: _raw_read(sock, view)
    return lambda: _raw_write(sock, view)


def _iterations(size: int, quick: bool) -> int:
    budget = (8 << 20) if quick else (96 << 20)  # bytes per case per round
    cap = 300 if quick else 3000
    return max(3 if quick else 8, min(cap, budget // size))


def _measure(cases: list[_Case], rounds: int, quick: bool) -> None:
    for _ in range(rounds):
        for case in cases:
            n = _iterations(case.size * case.batch, quick)
            case.run()  # warm: connections, mappings, caches
            t_all = time.perf_counter_ns()
            for _ in range(n):
                t0 = time.perf_counter_ns()
                case.run()
                case.lat_ns.append(time.perf_counter_ns() - t0)
            elapsed = (time.perf_counter_ns() - t_all) / 1e9
            case.rates.append(n * case.size * case.batch / elapsed)


def _row(case: _Case, baseline: _Case | None) -> dict[str, Any]:
    rate = statistics.median(case.rates)
    p50_us = percentile(case.lat_ns, 0.5) / 1e3
    extra: dict[str, Any] = {
        "rounds": len(case.rates),
        "bytes_per_s_at_p50": case.size * case.batch / (p50_us / 1e6),
    }
    if baseline is not None:
        # Two ratios: of the median per-op times (robust to a neighbour stealing the CPU for a
        # few ms, which on a 2-core shared machine happens every run), and of the median
        # throughputs over rounds (what a long stream of such ops gets, stalls included).
        extra["ratio_to_baseline"] = (percentile(baseline.lat_ns, 0.5) / 1e3) / p50_us
        extra["throughput_ratio_to_baseline"] = rate / statistics.median(baseline.rates)
    return Row(
        system=case.system,
        path=case.path,
        op=case.op,
        value_size=case.size,
        batch=case.batch,
        ops_per_s=rate / case.size,  # values (keys) per second
        bytes_per_s=rate,
        p50_us=p50_us,
        p99_us=percentile(case.lat_ns, 0.99) / 1e3,
        calls=len(case.lat_ns),
        baseline=baseline.path if baseline is not None else "",
        extra=extra,
    ).to_json()


def _verify(shm: TransferEngine, tcp: TransferEngine, size: int) -> None:
    """Bytes written by each path read back identically through both paths."""
    rng = np.random.default_rng(size)
    for writer, name in ((shm, "shm"), (tcp, "tcp")):
        data = rng.integers(0, 256, size, dtype=np.uint8)
        writer.transfer([TransferRequest(TransferOp.WRITE, data, "bench", 0)])
        want = xxhash.xxh3_64_intdigest(data.data)
        for reader, rname in ((shm, "shm"), (tcp, "tcp")):
            out = np.zeros(size, dtype=np.uint8)
            reader.transfer([TransferRequest(TransferOp.READ, out, "bench", 0)])
            if xxhash.xxh3_64_intdigest(out.data) != want:
                raise click.ClickException(f"{size} B written by {name}, read by {rname}: differ")


def _cutover_rows(quick: bool, rounds: int) -> list[dict[str, Any]]:
    """submit()+wait() of one local copy: inline in the caller vs the memcpy pool thread."""
    sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20]
    rows: list[dict[str, Any]] = []
    with SegmentMemory.create("cutover", 8 << 20) as mem:
        inline = TransferEngine(_no_segment, inline_copy_bytes=1 << 40)
        pooled = TransferEngine(_no_segment, inline_copy_bytes=0)
        try:
            inline.attach_local(mem)
            pooled.attach_local(mem)
            cases: list[_Case] = []
            for size in sizes:
                buf = np.ones(size, dtype=np.uint8)
                for eng, path in ((inline, "local-inline"), (pooled, "local-pool")):
                    req = [TransferRequest(TransferOp.WRITE, buf, "cutover", 0)]

                    def go(eng: TransferEngine = eng, req: list[TransferRequest] = req) -> None:
                        eng.submit(req).wait(10)

                    cases.append(_Case("kvpool", path, "write", size, go))
            _measure(cases, rounds, quick)
            rows = [_row(c, None) for c in cases]
        finally:
            inline.close()
            pooled.close()
    return rows


def _no_segment(name: str) -> SegmentLocation:
    raise click.ClickException(f"segment {name} is not local")


_BATCH = 64


def _batch_cases(
    shm: TransferEngine, tcp: TransferEngine, size: int
) -> list[tuple[_Case, _Case | None]]:
    """One call moving `_BATCH` values of `size` (a batch get/put of the Store)."""
    buf = np.ones(size * _BATCH, dtype=np.uint8)
    cases: list[tuple[_Case, _Case | None]] = []
    for op, top in (("read", TransferOp.READ), ("write", TransferOp.WRITE)):
        reqs = [
            TransferRequest(top, buf[k * size : (k + 1) * size], "bench", k * size)
            for k in range(_BATCH)
        ]
        for eng, path in ((shm, "shm"), (tcp, "tcp")):
            cases.append((_Case("kvpool", path, op, size, _transferrer(eng, reqs), _BATCH), None))
    return cases


def run(
    sizes: list[int], rounds: int, quick: bool, streams: int | None = None
) -> list[dict[str, Any]]:
    """Measure every case; returns the rows (`kvpool.bench.rows`, in their JSON form)."""
    peer = _Peer(max(sizes) + (1 << 20))
    loc = peer.location
    raw_sock = peer.raw
    assert raw_sock is not None
    shm = TransferEngine(lambda n: loc, "shm")
    tcp = TransferEngine(lambda n: loc, "tcp", tcp_streams=streams)
    try:
        cases: list[tuple[_Case, _Case | None]] = []
        for size in sizes:
            user = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
            other = np.empty(size, dtype=np.uint8)
            other[:] = 1  # touched: a baseline into fresh pages would measure page faults
            for op in ("read", "write"):
                reqs = [
                    TransferRequest(TransferOp.READ, other, "bench", 0)
                    if op == "read"
                    else TransferRequest(TransferOp.WRITE, user, "bench", 0)
                ]
                # The baseline copies between the same two buffers the system reads into or
                # writes from, so caches and pages are alike.
                mcp = _Case("limit", "memcpy", op, size, _copier(user.data, other.data))
                sys_shm = _Case("kvpool", "shm", op, size, _transferrer(shm, reqs))
                raw_view = other.data if op == "read" else user.data
                sock = _Case("limit", "socket", op, size, _raw(raw_sock, op, raw_view))
                sys_tcp = _Case("kvpool", "tcp", op, size, _transferrer(tcp, reqs))
                cases += [(mcp, None), (sys_shm, mcp), (sock, None), (sys_tcp, sock)]
        small = min(sizes)
        if small * _BATCH <= loc.size:
            cases += _batch_cases(shm, tcp, small)
        _measure([c for c, _ in cases], rounds, quick)
        for size in sizes:
            _verify(shm, tcp, size)
        rows = [_row(c, b) for c, b in cases]
    finally:
        shm.close()
        tcp.close()
        peer.close()
    return rows + _cutover_rows(quick, rounds)


def _percent(r: dict[str, Any], key: str) -> str:
    return f"{r[key] * 100:.0f}%" if key in r else ""


_COLUMNS = (
    Column("system", "<7", lambda r: r["system"]),
    Column("path", "<13", lambda r: r["path"]),
    Column("op", "<6", lambda r: r["op"]),
    Column("size", ">10", lambda r: format_size(r["value_size"])),
    Column("batch", ">5", lambda r: str(r["batch"])),
    Column("GB/s", ">7", lambda r: f"{r['bytes_per_s'] / 1e9:.2f}"),
    Column("values/s", ">9", lambda r: f"{r['ops_per_s']:.0f}"),
    Column("p50 us", ">8", lambda r: f"{r['p50_us']:.1f}"),
    Column("p99 us", ">9", lambda r: f"{r['p99_us']:.1f}"),
    Column("vs limit", ">9", lambda r: _percent(r, "ratio_to_baseline")),
    Column("(thru)", ">7", lambda r: _percent(r, "throughput_ratio_to_baseline")),
)


def _table(rows: list[dict[str, Any]]) -> str:
    return render_table(_COLUMNS, rows)


@click.command("transfer")
@click.option("--quick", is_flag=True, help="Seconds, not minutes (what the tests run).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write rows here.")
@click.option(
    "--sizes",
    default="4KiB,1MiB,16MiB",
    show_default=True,
    help="Comma-separated value sizes.",
)
@click.option("--rounds", type=int, default=None, help="Interleaved rounds (default 7, quick 2).")
@click.option(
    "--streams", type=int, default=None, help="TCP streams per peer (default: the engine's)."
)
def command(
    quick: bool, json_file: str | None, sizes: str, rounds: int | None, streams: int | None
) -> None:
    """Data-plane bandwidth: shm and TCP between two processes, next to memcpy and raw sockets."""
    try:
        size_list = [parse_size(s.strip(), name="--sizes", minimum=1) for s in sizes.split(",")]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sizes") from exc
    n_rounds = rounds if rounds is not None else (2 if quick else 7)
    if n_rounds < 1:
        raise click.BadParameter("must be >= 1", param_hint="--rounds")
    rows = run(size_list, n_rounds, quick, streams)
    click.echo(_table(rows))
    if json_file:
        click.echo(f"wrote {write_json(json_file, rows)} rows to {json_file}")
