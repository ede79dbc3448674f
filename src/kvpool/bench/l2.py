"""`kvpool bench l2`: store / lookup / load throughput of L2 adapters, verified byte for byte.

Drives each adapter through its public asynchronous API (submit → eventfd → query) with a window
of `--depth` tasks in flight, the way the controllers do, then the whole StorageManager path:
an engine stores chunks (L1 → store controller → L2), drops them from L1 and prefetches them
back (L2 → prefetch controller → L1). Every loaded chunk is compared with what was stored (distinct
content per key), and a mismatch makes the command exit with status 1. It never asserts a speed.

Adapters: `--adapter '<json>'` or `--l2-adapter '<json>'` (both repeatable); without any,
`mock` and `fs` (in a temporary directory). The other storage-manager flags (`--l2-*-policy`,
`--l2-prefetch-max-in-flight`, `--l1-*`) configure the manager path. `--with-services` also starts, as children owned by this command, a redis-server
(if installed), moto's S3 server (if installed) and an embedded kvpool pool, and measures the
`resp`, `s3` and `kvpool` adapters against them. The baseline measured in the same run is a
numpy memcpy of the same bytes (system "limit", path "memcpy"); `ratio` is bytes/s over it.

    kvpool bench l2 --quick
    kvpool bench l2 --with-services --json l2.json
    kvpool bench l2 --adapter '{"type":"fs","base_path":"/nvme/l2"}' --l2-prefetch-max-in-flight 16
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import click
import numpy as np

from kvpool.bench.peers.redis_peer import find_redis_server
from kvpool.bench.rows import Column, Row, median_row, percentile, render_table, write_json
from kvpool.cache.adapters.base import L2Adapter, L2TaskId
from kvpool.cache.adapters.registry import create_adapter, parse_adapter_config
from kvpool.cache.config import StorageManagerConfig, storage_manager_options
from kvpool.cache.keys import ObjectKey
from kvpool.cache.l1 import L1Config, L1Status
from kvpool.cache.manager import StorageManager
from kvpool.cache.memory import MemoryLayout, MemoryObj
from kvpool.children import Child, free_port
from kvpool.config import format_size
from kvpool.errors import ErrorCode, KVPoolError

__all__ = ["Case", "command", "median_rows", "run"]

KiB = 1 << 10
MiB = 1 << 20
TASK_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Case:
    value_size: int
    keys: int
    batch: int


def cases(quick: bool) -> list[Case]:
    if quick:
        return [Case(64 * KiB, 32, 8)]
    return [Case(64 * KiB, 512, 16), Case(1 * MiB, 128, 16), Case(4 * MiB, 32, 4)]


def pattern(i: int, size: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Distinct, cheap content per key index (a wrong or swapped chunk never compares equal)."""
    words = np.arange(size // 8 + 1, dtype=np.uint64)
    words *= np.uint64(2 * i + 1)
    words += np.uint64((i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    return words.view(np.uint8)[:size]


def _row(
    system: str,
    path: str,
    op: str,
    case: Case,
    *,
    elapsed: float,
    lat: Sequence[float],
    verified: bool,
    keys: int | None = None,
) -> Row:
    n = case.keys if keys is None else keys
    return Row(
        system=system,
        path=path,
        op=op,
        value_size=case.value_size,
        batch=case.batch,
        ops_per_s=n / elapsed if elapsed > 0 else 0.0,
        # A lookup moves no value bytes: its row reports keys/s only.
        bytes_per_s=n * case.value_size / elapsed if elapsed > 0 and op != "lookup" else 0.0,
        p50_us=percentile(lat, 0.50) * 1e6,
        p99_us=percentile(lat, 0.99) * 1e6,
        calls=len(lat),
        extra={"keys": n, "verified": verified},
    )


# -- adapter pipeline -----------------------------------------------------------------------


def _pipeline(
    adapter: L2Adapter,
    kind: str,
    batches: list[tuple[list[ObjectKey], list[MemoryObj]]],
    depth: int,
) -> tuple[float, list[float], list[Any]]:
    """Run every batch with at most `depth` tasks in flight; (elapsed s, latencies, results)."""
    fd = {
        "store": adapter.get_store_event_fd,
        "lookup": adapter.get_lookup_and_lock_event_fd,
        "load": adapter.get_load_event_fd,
    }[kind]()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    pending: dict[L2TaskId, tuple[int, float]] = {}
    results: list[Any] = [None] * len(batches)
    lat: list[float] = []
    nxt = done = 0
    start = time.perf_counter()
    deadline = time.monotonic() + TASK_TIMEOUT_S * max(1, len(batches))
    while done < len(batches):
        while nxt < len(batches) and len(pending) < depth:
            keys, objs = batches[nxt]
            t_submit = time.perf_counter()  # before: an adapter may complete inside submit
            if kind == "store":
                tid = adapter.submit_store_task(keys, objs)
            elif kind == "lookup":
                tid = adapter.submit_lookup_and_lock_task(keys)
            else:
                tid = adapter.submit_load_task(keys, objs)
            pending[tid] = (nxt, t_submit)
            nxt += 1
        if time.monotonic() > deadline:
            raise KVPoolError(f"{kind} tasks did not complete in time", ErrorCode.RPC_TIMEOUT)
        if poller.poll(100):
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(fd)
        finished: dict[L2TaskId, Any]
        if kind == "store":
            finished = dict(adapter.pop_completed_store_tasks())
        else:
            query = (
                adapter.query_lookup_and_lock_result
                if kind == "lookup"
                else adapter.query_load_result
            )
            finished = {}
            for tid in list(pending):
                r = query(tid)
                if r is not None:
                    finished[tid] = r
        now = time.perf_counter()
        for tid, result in finished.items():
            slot = pending.pop(tid, None)
            if slot is None:
                continue
            results[slot[0]] = result
            lat.append(now - slot[1])
            done += 1
    return time.perf_counter() - start, lat, results


def _type_name(spec: dict[str, Any]) -> str:
    return parse_adapter_config(spec).type_name


def bench_adapter(spec: dict[str, Any], case: Case, depth: int) -> tuple[list[Row], list[str]]:
    """store → lookup → load of one case through one adapter; (rows, verification errors)."""
    path = _type_name(spec)
    errors: list[str] = []
    run_id = uuid.uuid4().hex[:8]
    keys = [ObjectKey(f"bench/{run_id}", 0, i.to_bytes(8, "big")) for i in range(case.keys)]
    layout = MemoryLayout.of_bytes(case.value_size)
    src = []
    for i, k in enumerate(keys):
        o = MemoryObj(k, layout)
        o.array[:] = pattern(i, case.value_size)
        src.append(o)
    dst = [MemoryObj(k, layout) for k in keys]
    groups = [
        list(range(i, min(i + case.batch, case.keys))) for i in range(0, case.keys, case.batch)
    ]
    adapter = create_adapter(spec)
    rows: list[Row] = []
    try:
        t, lat, res = _pipeline(
            adapter, "store", [([keys[i] for i in g], [src[i] for i in g]) for g in groups], depth
        )
        failed = sum(1 for r in res if not r.ok)
        if failed:
            errors.append(
                f"{path}: {failed} store tasks failed: {next(r.error for r in res if not r.ok)}"
            )
        rows.append(
            _row("kvpool.cache", path, "store", case, elapsed=t, lat=lat, verified=not failed)
        )

        t, lat, res = _pipeline(
            adapter, "lookup", [([keys[i] for i in g], []) for g in groups], depth
        )
        found = sum(r.popcount() for r in res)
        if found != case.keys:
            errors.append(f"{path}: lookup found {found} of {case.keys} keys")
        rows.append(
            _row(
                "kvpool.cache",
                path,
                "lookup",
                case,
                elapsed=t,
                lat=lat,
                verified=found == case.keys,
            )
        )

        for o in dst:
            o.array[:] = 0
        t, lat, res = _pipeline(
            adapter, "load", [([keys[i] for i in g], [dst[i] for i in g]) for g in groups], depth
        )
        loaded = sum(r.popcount() for r in res)
        wrong = sum(
            1 for a, b in zip(src, dst, strict=True) if not np.array_equal(a.array, b.array)
        )
        if loaded != case.keys or wrong:
            errors.append(
                f"{path}: loaded {loaded} of {case.keys} keys, {wrong} differ from what was stored"
            )
        rows.append(
            _row(
                "kvpool.cache",
                path,
                "load",
                case,
                elapsed=t,
                lat=lat,
                verified=loaded == case.keys and not wrong,
            )
        )
        adapter.submit_unlock(keys)
        delete = getattr(adapter, "delete", None)
        if callable(delete):  # leave shared stores (redis, s3, the pool) as we found them
            delete(keys)
    finally:
        adapter.close()
    return rows, errors


def bench_manager(
    spec: dict[str, Any], case: Case, base: StorageManagerConfig
) -> tuple[list[Row], list[str]]:
    """An engine stores through L1 → L2, forgets L1, prefetches everything back; verified."""
    path = _type_name(spec)
    errors: list[str] = []
    run_id = uuid.uuid4().hex[:8]
    keys = [ObjectKey(f"bench-sm/{run_id}", 0, i.to_bytes(8, "big")) for i in range(case.keys)]
    layout = MemoryLayout.of_bytes(case.value_size)
    values = [pattern(i + 7, case.value_size) for i in range(case.keys)]
    need = case.keys * case.value_size
    cfg = replace(
        base,
        adapters=(parse_adapter_config(spec),),
        l1=L1Config(
            capacity_bytes=max(base.l1.capacity_bytes, 2 * need),
            write_ttl_s=base.l1.write_ttl_s,
            read_ttl_s=base.l1.read_ttl_s,
            eviction_watermark=base.l1.eviction_watermark,
        ),
    )
    rows: list[Row] = []
    # One manager: it stores, then drops its L1 copies, then prefetches them back from L2 (an
    # in-memory adapter lives and dies with its manager, so a second manager would see nothing).
    with StorageManager(cfg) as sm:
        start = time.perf_counter()
        sm.store(keys, [v.data for v in values], layout)
        if not sm.wait_stores(TASK_TIMEOUT_S):
            errors.append(f"{path}: manager stores did not finish")
        t = time.perf_counter() - start
        st = sm.store_stats()
        ok = st.stored_keys == case.keys and st.failed_tasks == 0
        if not ok:
            errors.append(f"{path}: manager stored {st.stored_keys} of {case.keys} keys")
        rows.append(_row("kvpool.cache", path, "sm_store", case, elapsed=t, lat=[t], verified=ok))
        if sm.l1.delete(keys).count(L1Status.OK) != case.keys:
            errors.append(f"{path}: L1 copies were still locked after the stores finished")
        groups = [keys[i : i + case.batch] for i in range(0, case.keys, case.batch)]
        start = time.perf_counter()
        handles = [(sm.submit_prefetch_task(g, layout), time.perf_counter()) for g in groups]
        lat: list[float] = []
        hits_total = 0
        wrong = 0
        for (h, t0), g in zip(handles, groups, strict=True):
            hits = sm.wait_prefetch(h, TASK_TIMEOUT_S)
            lat.append(time.perf_counter() - t0)
            hits_total += hits
            with sm.read_prefetched_results(g[:hits]) as objs:
                base_i = keys.index(g[0])
                wrong += sum(
                    1 for j, o in enumerate(objs) if not np.array_equal(o.array, values[base_i + j])
                )
            if sm.finish_read_prefetched(g[:hits]).count(L1Status.OK) != hits:
                errors.append(f"{path}: prefetch read locks were not all held")
        t = time.perf_counter() - start
        ok = hits_total == case.keys and wrong == 0
        if not ok:
            errors.append(f"{path}: prefetched {hits_total} of {case.keys} keys, {wrong} wrong")
        rows.append(
            _row("kvpool.cache", path, "sm_prefetch", case, elapsed=t, lat=lat, verified=ok)
        )
    cleaner = create_adapter(spec)
    try:
        delete = getattr(cleaner, "delete", None)
        if callable(delete):
            delete(keys)
    finally:
        cleaner.close()
    return rows, errors


def bench_memcpy(case: Case, reps: int) -> Row:
    src = np.frombuffer(np.random.default_rng(0).bytes(case.value_size), dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the destination first
    lat = []
    start = time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(case.keys):
            np.copyto(dst, src)
        lat.append(time.perf_counter() - t0)
    t = time.perf_counter() - start
    return _row(
        "limit",
        "memcpy",
        "copy",
        case,
        elapsed=t / reps,
        lat=lat,
        verified=bool(np.array_equal(src, dst)),
    )


# -- services -------------------------------------------------------------------------------


@contextlib.contextmanager
def _redis_server() -> Iterator[str | None]:
    binary = find_redis_server()
    if binary is None:
        yield None
        return
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with Child(args, name="redis-server") as proc:
        proc.wait_line(r"Ready to accept connections", timeout=15)
        yield f"127.0.0.1:{port}"


@contextlib.contextmanager
def _moto_server() -> Iterator[str | None]:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        yield None
        return
    port = free_port()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def _services(quick: bool) -> Iterator[list[dict[str, Any]]]:
    from kvpool.client.embedded import EmbeddedPool, PoolSpec

    with contextlib.ExitStack() as stack:
        specs: list[dict[str, Any]] = []
        redis_addr = stack.enter_context(_redis_server())
        if redis_addr:
            host, port = redis_addr.rsplit(":", 1)
            specs.append({"type": "resp", "host": host, "port": int(port)})
        s3 = stack.enter_context(_moto_server())
        if s3:
            specs.append(
                {
                    "type": "s3",
                    "endpoint_url": s3,
                    "bucket": "kvpool-bench",
                    "create_bucket": True,
                    "access_key_id": "bench",
                    "secret_access_key": "bench",
                }
            )
        pool = stack.enter_context(
            EmbeddedPool(PoolSpec(segment_size=(256 if quick else 1024) * MiB))
        )
        specs.append({"type": "kvpool", "master": pool.address})
        yield specs


# -- command --------------------------------------------------------------------------------


def run(
    specs: Sequence[dict[str, Any]], *, quick: bool, depth: int, manager: StorageManagerConfig
) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    errors: list[str] = []
    for case in cases(quick):
        limit = bench_memcpy(case, 3 if quick else 10)
        rows.append(limit)
        for spec in specs:
            got, errs = bench_adapter(spec, case, depth)
            more, errs2 = bench_manager(spec, case, manager)
            for r in (*got, *more):
                if r.bytes_per_s and limit.bytes_per_s:
                    r.ratio = r.bytes_per_s / limit.bytes_per_s
                    r.baseline = "memcpy"
            rows += got + more
            errors += errs + errs2
    return rows, errors


_COLUMNS = (
    Column("path", "<8", lambda r: r.path),
    Column("op", "<12", lambda r: r.op),
    Column("size", ">9", lambda r: format_size(r.value_size)),
    Column("batch", ">5", lambda r: str(r.batch)),
    Column("keys/s", ">10", lambda r: f"{r.ops_per_s:.0f}"),
    Column("MB/s", ">9", lambda r: f"{r.bytes_per_s / 1e6:.1f}"),
    Column("p50 ms", ">8", lambda r: f"{r.p50_us / 1e3:.2f}"),
    Column("p99 ms", ">8", lambda r: f"{r.p99_us / 1e3:.2f}"),
    Column("vs memcpy", ">9", lambda r: f"{r.ratio:.4f}" if r.ratio is not None else "-"),
    Column("ok", "", lambda r: "yes" if r.extra["verified"] else "NO"),
)


def _table(rows: Sequence[Row]) -> str:
    return render_table(_COLUMNS, rows)


def _measure(
    specs: list[dict[str, Any]],
    *,
    with_services: bool,
    repeat: int,
    quick: bool,
    depth: int,
    manager: StorageManagerConfig,
) -> tuple[list[Row], list[str]]:
    with contextlib.ExitStack() as stack:
        if not specs:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kvpool-bench-l2-"))
            specs = [{"type": "mock"}, {"type": "fs", "base_path": tmp}]
        if with_services:
            specs += stack.enter_context(_services(quick))
        runs: list[list[Row]] = []
        errors: list[str] = []
        for _ in range(repeat):
            rows, errs = run(specs, quick=quick, depth=depth, manager=manager)
            runs.append(rows)
            errors += errs
        rows = median_rows(runs) if repeat > 1 else runs[0]
        return rows, errors


@click.command(name="l2")
@click.option(
    "--adapter", "adapters", multiple=True, metavar="JSON", help="Adapter to measure (repeatable)."
)
@click.option(
    "--with-services", is_flag=True, help="Also start redis-server, moto S3 and a kvpool pool."
)
@click.option(
    "--depth", default=4, show_default=True, type=click.IntRange(1, 64), help="Tasks in flight."
)
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Runs; rows are medians.",
)
@click.option("--quick", is_flag=True, help="A few seconds (what the tests run).")
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), help="Write the rows as JSON."
)
@storage_manager_options
def command(  # noqa: PLR0917 - click passes options positionally by name
    adapters: tuple[str, ...],
    with_services: bool,
    depth: int,
    repeat: int,
    quick: bool,
    json_path: str | None,
    **manager_flags: Any,
) -> None:
    """Store/lookup/load throughput of L2 adapters and of the StorageManager path, verified."""
    try:
        manager = StorageManagerConfig.from_cli_args(**manager_flags)
        specs: list[dict[str, Any]] = []
        for text in adapters:
            spec = json.loads(text)
            parse_adapter_config(spec)  # fail now, with the offending text
            specs.append(spec)
        # --l2-adapter (the storage-manager flag) names adapters to measure as well.
        specs += [a.to_dict() for a in manager.adapters]
    except (KVPoolError, json.JSONDecodeError) as exc:
        raise click.BadParameter(str(exc), param_hint="--adapter / --l2-*") from exc
    # SIGTERM unwinds like Ctrl-C, so the children this command started are stopped in order.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        rows, errors = _measure(
            specs,
            with_services=with_services,
            repeat=repeat,
            quick=quick,
            depth=depth,
            manager=manager,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    click.echo(_table(rows))
    if json_path:
        write_json(json_path, rows)
    if errors:
        for e in errors:
            click.echo(f"VERIFY FAILED: {e}", err=True)
        raise SystemExit(1)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def median_rows(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """Per (path, op, size) the row with the median bytes/s over several runs (noisy machines)."""
    by_case: dict[tuple[str, str, int], list[Row]] = {}
    for rows in runs:
        for r in rows:
            by_case.setdefault((r.path, r.op, r.value_size), []).append(r)
    return [median_row(group, lambda r: r.bytes_per_s) for group in by_case.values()]
