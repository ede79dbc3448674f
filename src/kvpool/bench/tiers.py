"""`kvpool bench tiers`: put/get from memory and from a node's disk tier, next to plain file I/O.

One master (`--offload-policy on-evict --no-promotion-on-hit`, so what is on disk stays there
while it is measured) and, in this process, a Store that owns a memory segment and a disk tier
(`offload_dir` in a temporary directory, by default under the system's temp dir; `--dir` picks
the file system) plus a pure-client Store. Rows:

* `limit`/`file`: `pwrite` and `pread` of the same bytes in a file in the same directory, same
  run (the page cache is warm for both this and the disk tier: the tier's data file is written
  through the same cache);
* `kvpool`/`memory`: get (and put) through the pure client (shm from the node's memfd);
* `kvpool`/`disk-local`: get by the Store that owns the disk tier (memcpy from the mapped file);
* `kvpool`/`disk-shm`: get by a same-host client, which maps the tier's file itself and copies
  straight from the page cache;
* `kvpool`/`disk-tcp`: get by a client forced to TCP, streamed by the owner's transfer server;
* `kvpool`/`disk-on-evict`: put with memory full, each put moving an older object to disk;
* `kvpool`/`dfs`: put with `dfs_replica_num=1` (memory and the file in the master's
  `--dfs-root`, in DIR), and get/get_into of such objects once the filler dropped their memory
  replicas (read from the file with `preadv`); op `put_fsync`: the same put by a Store made
  with `dfs_fsync=True` (the file `fdatasync`ed before its rename);
* `limit`/`file+tcp`, op `get`: the same bytes `pread` from a file by a server thread and sent
  over a loopback TCP connection to this thread, which receives them into one buffer (lock-step,
  8-byte request): the most a file served over a socket moves here, same run; the `disk-tcp`
  rows carry their ratio to it (`x socket`) beside `x file`;
* `limit`/`file`, ops `write_rename` and `write_fsync_rename`: what a DFS put does to its file
  (a new temporary file written, closed and renamed), without and with the `fdatasync`;
* `kvpool`/`disk-local`, `disk-shm` and `disk-tcp`, op `get_into`: the same reads into one
  registered buffer (as the baseline preads into one buffer); a same-host disk replica is read
  with `preadv` from the tier's file (`kvpool.client.disk_files`), a TCP one is sent by the
  owner's transfer server with `sendfile` (`kvpool.transfer.serving`);
* every kvpool row carries `mode`: `strict` (each get asks the master, GetReplicaList) or
  `cached` (the disk and DFS gets again by Stores made with `read_mode="cached"`, each key read
  once untimed first so that its place is remembered: the timed gets ask nobody but the file
  or the owning node, `kvpool.client.locations`); the `x file` ratio is given for both;
* `metric: objects_beyond_ram_readable`: the fraction of objects read back exactly after
  writing 8x the memory in 1 MiB objects;
* `metric: promotion_seconds`, `promotion_rounds`, `promoted_get_vs_memory`,
  `disk_get_vs_memory`: a re-read hot set coming back to memory by promotion on hit, in a pool
  of its own (`kvpool.bench.promotion`);
* `metric: replica_tasks_failed`: offload tasks the owner failed during the run (a source
  that did not match its checksum among them; 0 expected).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import click
import xxhash

from kvpool.bench.promotion import promotion_rows
from kvpool.bench.rows import Column, Row, percentile, render_table, write_json
from kvpool.client.embedded import EmbeddedPool, PoolSpec
from kvpool.client.replicate import ReplicateConfig
from kvpool.client.store import Store
from kvpool.errors import KVPoolError
from kvpool.protocol.messages import ReplicaKind

__all__ = ["command", "run"]

MiB = 1 << 20
_DFS = ReplicateConfig(dfs_replica_num=1)


@dataclass(frozen=True, slots=True)
class Plan:
    memory: int
    disk: int
    reps: dict[int, int]

    @staticmethod
    def of(quick: bool) -> Plan:
        if quick:
            return Plan(memory=64 * MiB, disk=768 * MiB, reps={MiB: 8, 16 * MiB: 3})
        return Plan(memory=256 * MiB, disk=3 << 30, reps={MiB: 64, 16 * MiB: 12})


def _value(i: int, size: int, tag: str = "tiersbch") -> bytes:
    """Object `i`'s bytes; `tag` (8 bytes shown) tells the phases apart, so that bytes found
    in a wrong place name the object they came from."""
    return (i.to_bytes(8, "little") + tag.encode()[-8:].rjust(8, b".")) * (size // 16)


def _row(path: str, system: str, op: str, size: int, times: list[float], **extra: Any) -> Row:
    if system == "kvpool":
        extra.setdefault("mode", "strict")
    total = sum(times) or 1e-9
    n = len(times)
    return Row(
        system=system,
        path=path,
        op=op,
        value_size=size,
        batch=1,
        ops_per_s=n / total,
        bytes_per_s=n * size / total,
        p50_us=percentile(times, 0.5) * 1e6,
        p99_us=percentile(times, 0.99) * 1e6,
        calls=n,
        extra=extra,
    )


def _timed(n: int, fn: Callable[[int], object]) -> list[float]:
    out: list[float] = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def _file_rows(directory: str, size: int, n: int) -> list[Row]:
    path = os.path.join(directory, f"baseline-{size}")
    data = _value(7, size)
    dest = bytearray(size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size * n)
        put = _timed(n, lambda i: os.pwrite(fd, data, i * size))
        get = _timed(n, lambda i: os.preadv(fd, [dest], i * size))
    finally:
        os.close(fd)
        os.unlink(path)
    rows = [_row("file", "limit", "put", size, put), _row("file", "limit", "get", size, get)]
    for op, sync in (("write_rename", False), ("write_fsync_rename", True)):
        rows.append(_row("file", "limit", op, size, _timed(n, _new_file(directory, data, sync))))
        for i in range(n):
            os.unlink(os.path.join(directory, f"baseline-new-{i}"))
    return rows


def _file_socket_row(directory: str, size: int, n: int) -> Row:
    """`limit`/`file+tcp` get (module docstring): `pread` then `sendall` by a server thread,
    `recv_into` one buffer here, over a loopback TCP connection."""
    path = os.path.join(directory, f"baseline-tcp-{size}")
    data = _value(7, size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)  # the thread's accept ends even if the client never comes
    out, into = bytearray(size), bytearray(size)
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(30)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = bytearray(8)
            while not done.is_set():
                if conn.recv_into(head, 8, socket.MSG_WAITALL) != 8:
                    return  # the client closed
                (offset,) = struct.unpack("<Q", head)
                os.preadv(fd, [out], offset)
                conn.sendall(out)

    server = threading.Thread(target=serve, name="bench-file-tcp", daemon=True)
    try:
        for i in range(n):
            os.pwrite(fd, data, i * size)
        server.start()
        with socket.create_connection(listener.getsockname(), timeout=30) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            view = memoryview(into)

            def get(i: int) -> None:
                c.sendall(struct.pack("<Q", i * size))
                got = 0
                while got < size:
                    k = c.recv_into(view[got:], size - got)
                    if not k:
                        raise KVPoolError("the baseline's file server closed")
                    got += k

            times = _timed(n, get)
            if into != data:
                raise KVPoolError("the file+tcp baseline read back wrong")
            done.set()
    finally:
        done.set()
        listener.close()
        server.join(timeout=10)
        os.close(fd)
        os.unlink(path)
    return _row("file+tcp", "limit", "get", size, times)


def _new_file(directory: str, data: bytes, sync: bool) -> Callable[[int], None]:
    """Call `i` writes file `i` as `kvpool.client.dfs.write` writes a DFS file."""

    def write(i: int) -> None:
        path = os.path.join(directory, f"baseline-new-{i}")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            if sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        os.rename(path + ".tmp", path)

    return write


def _only(store: Store, key: str, kind: ReplicaKind) -> bool:
    return [ReplicaKind(r.kind) for r in store.get_replica_desc(key)] == [kind]


def _disk_only(store: Store, key: str) -> bool:
    return _only(store, key, ReplicaKind.LOCAL_DISK)


def run(quick: bool = False, directory: str | None = None) -> list[Any]:
    """Run the benchmark (a master child process, two Stores here); returns its rows."""
    plan = Plan.of(quick)
    root = tempfile.mkdtemp(prefix="kvpool-bench-tiers-", dir=directory)
    pool = EmbeddedPool(
        PoolSpec(
            segment_size=0,
            nodes=0,
            master_args=(
                "--offload-policy",
                "on-evict",
                "--no-promotion-on-hit",
                "--dfs-root",
                os.path.join(root, "dfs"),
            ),
        )
    )
    rows: list[Any] = []
    try:
        address = pool.start()
        # The owner reads in cached mode for the cached rows only (`_Readers.strict`).
        owner = Store(
            address,
            segment_size=plan.memory,
            offload_dir=os.path.join(root, "disk"),
            offload_size=plan.disk,
            rpc_timeout=60.0,
            read_mode="cached",
        )
        client = Store(address, rpc_timeout=60.0)
        tcp = Store(address, rpc_timeout=60.0, protocol="tcp")
        cached = Store(address, rpc_timeout=60.0, read_mode="cached")
        cached_tcp = Store(address, rpc_timeout=60.0, protocol="tcp", read_mode="cached")
        readers = _Readers(owner, client, tcp, cached, cached_tcp)
        try:
            for size, n in plan.reps.items():
                rows += _size_rows(readers, root, size, n, plan)
            rows.append(_capacity(client, plan))
            rows += promotion_rows(plan.memory, plan.disk, root)
            tasks = owner.task_stats
            rows.append(
                {
                    "system": "kvpool",
                    "path": "disk",
                    "metric": "replica_tasks_failed",
                    "value": tasks.failed if tasks is not None else 0,
                    "objects": tasks.succeeded if tasks is not None else 0,
                }
            )
        finally:
            cached_tcp.close()
            cached.close()
            tcp.close()
            client.close()
            owner.close()
    finally:
        pool.close()
        shutil.rmtree(root, ignore_errors=True)
    return rows


@dataclass(frozen=True, slots=True)
class _Readers:
    """The Stores of a run: `owner` (memory and the disk tier; cached mode, strict while
    `strict()` holds), `client` (same host), `tcp` (TCP forced), and `cached` / `cached_tcp`,
    the same two in cached read mode."""

    owner: Store
    client: Store
    tcp: Store
    cached: Store
    cached_tcp: Store

    @contextlib.contextmanager
    def strict(self) -> Iterator[None]:
        """The owner reads as a strict Store meanwhile (its remembered places set aside)."""
        reader = self.owner._reader
        locations, reader.locations = reader.locations, None
        try:
            yield
        finally:
            reader.locations = locations


def _size_rows(readers: _Readers, root: str, size: int, n: int, plan: Plan) -> list[Row]:
    owner, client, tcp = readers.owner, readers.client, readers.tcp
    base = _file_rows(root, size, n)
    file_get = base[1]
    base.append(_file_socket_row(root, size, n))
    file_tcp = base[-1]
    tag = f"s{size}"
    # Memory: the last objects written stay in memory.
    owner.remove_all(force=True)
    mem_put = _timed(n, lambda i: client.put(f"{tag}-m{i}", _value(i, size, f"{tag}m")))
    mem_get = _timed(n, lambda i: client.get(f"{tag}-m{i}"))
    rows = [
        _row("memory", "kvpool", "put", size, mem_put),
        _row("memory", "kvpool", "get", size, mem_get),
    ]
    # Disk: written first, then pushed out of memory by filler (on-evict moves them to disk).
    for i in range(n):
        client.put(f"{tag}-d{i}", _value(i, size, f"{tag}d"))
    # DFS: written with a DFS copy (memory + the file); the filler then drops their memory
    # replicas (a DFS copy keeps them readable), so they are read from the file.
    dfs_put = _timed(n, lambda i: client.put(f"{tag}-x{i}", _value(i, size, f"{tag}x"), _DFS))
    rows.append(_row("dfs", "kvpool", "put", size, dfs_put))
    with Store(client.master, rpc_timeout=60.0, dfs_fsync=True) as syncer:
        synced = _timed(n, lambda i: syncer.put(f"{tag}-y{i}", _value(i, size, f"{tag}y"), _DFS))
    rows.append(_row("dfs", "kvpool", "put_fsync", size, synced))
    # Checking touches the objects (an access, a lease): fill a memory's worth between checks.
    filler = 0
    fill_times: list[float] = []
    for _ in range(6):
        for _ in range(plan.memory // MiB):
            t = time.perf_counter()
            client.put(f"{tag}-f{filler}", _value(filler, MiB, f"{tag}f"))
            fill_times.append(time.perf_counter() - t)
            filler += 1
        if all(_disk_only(client, f"{tag}-d{i}") for i in range(n)) and all(
            _only(client, f"{tag}-x{i}", ReplicaKind.DFS) for i in range(n)
        ):
            break
    else:
        raise KVPoolError("objects did not move to the disk tier")
    if size == MiB and fill_times:
        rows.append(_row("disk-on-evict", "kvpool", "put", MiB, fill_times))

    _settle(owner)

    expected = {
        p: [xxhash.xxh3_64_intdigest(_value(i, size, f"{tag}{p}")) for i in range(n)] for p in "dx"
    }

    def timed_gets(store: Store, phase: str = "d") -> list[float]:
        # Each value is checked and let go right after its timed get (outside the timing):
        # keeping them all would time the faulting-in of fresh pages for every result, which
        # the memory row (and the baseline) does not pay. Checked by hash: comparing with a
        # fresh expected value would allocate between the gets, and glibc would hand the
        # next result pages that fault in again.
        times: list[float] = []
        want = expected[phase]
        for i in range(n):
            t = time.perf_counter()
            got = store.get(f"{tag}-{phase}{i}")
            times.append(time.perf_counter() - t)
            if xxhash.xxh3_64_intdigest(got) != want[i]:
                raise KVPoolError(f"{tag}-{phase}{i} read back wrong")
            del got
        return times

    def timed_gets_into(store: Store, phase: str = "d") -> list[float]:
        # Into one registered buffer, as the baseline preads into one buffer.
        buf = bytearray(size)
        store.register_buffer(buf)
        times: list[float] = []
        want = expected[phase]
        try:
            for i in range(n):
                t = time.perf_counter()
                store.get_into(f"{tag}-{phase}{i}", buf)
                times.append(time.perf_counter() - t)
                if xxhash.xxh3_64_intdigest(buf) != want[i]:
                    raise KVPoolError(f"{tag}-{phase}{i} read back wrong")
        finally:
            store.unregister_buffer(buf)
        return times

    def remembered(store: Store, phase: str) -> None:
        # A cached Store's first get of a key asks the master and remembers the place: once
        # each, untimed, so that the timed gets read the remembered places.
        for i in range(n):
            if xxhash.xxh3_64_intdigest(store.get(f"{tag}-{phase}{i}")) != expected[phase][i]:
                raise KVPoolError(f"{tag}-{phase}{i} read back wrong")

    with readers.strict():
        disk = [
            _row("disk-local", "kvpool", "get", size, timed_gets(owner)),
            _row("disk-shm", "kvpool", "get", size, timed_gets(client)),
            _row("disk-tcp", "kvpool", "get", size, timed_gets(tcp)),
            _row("disk-local", "kvpool", "get_into", size, timed_gets_into(owner)),
            _row("disk-shm", "kvpool", "get_into", size, timed_gets_into(client)),
            _row("disk-tcp", "kvpool", "get_into", size, timed_gets_into(tcp)),
            _row("dfs", "kvpool", "get", size, timed_gets(client, "x")),
            _row("dfs", "kvpool", "get_into", size, timed_gets_into(client, "x")),
        ]
    cached = {"disk-local": owner, "disk-shm": readers.cached, "disk-tcp": readers.cached_tcp}
    for store in cached.values():
        remembered(store, "d")
    remembered(readers.cached, "x")
    for path, store in cached.items():
        disk.append(_row(path, "kvpool", "get", size, timed_gets(store), mode="cached"))
        disk.append(_row(path, "kvpool", "get_into", size, timed_gets_into(store), mode="cached"))
    disk.append(_row("dfs", "kvpool", "get", size, timed_gets(readers.cached, "x"), mode="cached"))
    disk.append(
        _row("dfs", "kvpool", "get_into", size, timed_gets_into(readers.cached, "x"), mode="cached")
    )
    for r in disk:
        r.ratio = r.bytes_per_s / file_get.bytes_per_s
        r.baseline = f"file pread {file_get.bytes_per_s / 1e9:.2f} GB/s"
        if r.path == "disk-tcp":
            r.extra["x_socket"] = r.bytes_per_s / file_tcp.bytes_per_s
    return [*base, *rows, *disk]


def _settle(owner: Store, quiet: float = 0.5, limit: float = 60.0) -> None:
    """Wait until the owner's task executor has been idle for `quiet` seconds: the moves that
    reclaim started while memory filled run in the owner's process, and would be measured
    with the reads otherwise."""
    tasks = owner.task_stats
    if tasks is None:
        return
    end = time.monotonic() + limit
    last = (-1, -1)
    while time.monotonic() < end:
        now = (tasks.succeeded, tasks.failed)
        if now == last:
            return
        last = now
        time.sleep(quiet)


def _capacity(client: Store, plan: Plan) -> dict[str, Any]:
    client.remove_all(force=True)
    n = 8 * plan.memory // MiB
    t = time.perf_counter()
    for i in range(n):
        client.put(f"cap{i}", _value(i, MiB, "capacity"))
    put_s = time.perf_counter() - t
    exact = 0
    for i in range(n):
        with contextlib.suppress(KVPoolError):
            exact += client.get(f"cap{i}") == _value(i, MiB, "capacity")
    return {
        "system": "kvpool",
        "path": "disk",
        "metric": "objects_beyond_ram_readable",
        "value": exact / n,
        "objects": n,
        "memory_bytes": plan.memory,
        "data_bytes": n * MiB,
        "put_bytes_per_s": n * MiB / put_s,
    }


_COLUMNS = (
    Column("system", "<7", lambda r: r.system),
    Column("path", "<14", lambda r: r.path),
    Column("mode", "<6", lambda r: str(r.extra.get("mode", ""))),
    Column("op", "<8", lambda r: r.op),
    Column("size", ">9", lambda r: f"{r.value_size // 1024} KiB"),
    Column("GB/s", ">7", lambda r: f"{r.bytes_per_s / 1e9:.2f}"),
    Column("p50 us", ">9", lambda r: f"{r.p50_us:.0f}"),
    Column("p99 us", ">9", lambda r: f"{r.p99_us:.0f}"),
    Column("x file", ">7", lambda r: "" if r.ratio is None else f"{r.ratio:.2f}"),
    Column(
        "x socket", ">8", lambda r: f"{r.extra['x_socket']:.2f}" if "x_socket" in r.extra else ""
    ),
)


@click.command()
@click.option("--quick", is_flag=True, help="Few calls and a 64 MiB memory (tests).")
@click.option("--json", "json_path", default=None, help="Write the rows as JSON to this file.")
@click.option("--dir", "directory", default=None, help="Where the disk tier and baseline go.")
def command(*, quick: bool, json_path: str | None, directory: str | None) -> None:
    """Memory and disk-tier put/get (1 MiB, 16 MiB) beside pread/pwrite; data 8x the memory."""
    rows = run(quick=quick, directory=directory)
    click.echo(render_table(_COLUMNS, [r for r in rows if isinstance(r, Row)]))
    for r in rows:
        if not isinstance(r, Row):
            if r["metric"] == "replica_tasks_failed":
                click.echo(f"replica_tasks_failed: {r['value']} (of {r['objects']} succeeded)")
            else:
                click.echo(f"{r['metric']}: {r['value']:.3f} ({r['objects']} objects)")
    if json_path:
        write_json(json_path, rows)
