"""`kvpool bench fuzz`: hostile input at a real master and a real node; both must come out whole
(issue #15, "Hostile input").

Setup: `kvpool master` and `kvpool node` as child processes on 127.0.0.1 ephemeral ports (the
master without its Unix socket, so every client goes through the TCP listener under fire), and
in this process a prober `Store` with `protocol="tcp"`, so its bytes go through the node's
transfer server, not shared memory. A short warm-up round (every kind of input once or more)
comes before the baseline, so that what a first use allocates for good (worker threads up to the
pool's bound, allocator arenas, the interpreter's caches) is not counted as growth.

Then, for `--seconds` or until `--frames` frames were sent, whichever comes first, one thread
per target throws sessions at it, one loopback connection each, chosen by a generator seeded by
`--seed`:

* **master** (the RPC port): random bytes, before and after a valid `Hello`; truncated frames;
  oversized and too-short length prefixes (`kvpool.bench.chaos_faults`); valid framing with
  garbage payloads; valid-but-wrong messages, hundreds per connection, made from the request
  and reply unions' own type descriptions (`msgspec.inspect`): wrong tags, replies sent as
  requests, wrongly typed fields, out-of-range integers, negative sizes, huge batches, reserved
  or flagged request ids; a request before the `Hello`; a second `Hello`; half-open connections
  (nothing, half a `Hello`, half a frame) that are held.
* **transfer** (the node's data port): random bytes; truncated headers; bad magic, op or name
  length; pipelined valid-but-wrong requests (unknown segments, offsets and lengths out of
  bounds or overflowing 64 bits, zero lengths, writes to unknown segments with their payload,
  small in-bounds reads); writes cut short in the middle of their payload; half-open
  connections (nothing, half a header, a write's header without its payload) that are held.

Every non-held session is sent while its replies are read, then half-closed and drained until
the server closes it or `session_deadline_s` passes. Requests that would be *legitimate*
without authentication are never sent well formed (mounting, unmounting, removing everything,
puts of a plausible size: issue #15's auth and orphan-put items, not hostile-input bugs), so
that the probes measure the servers, not those known holes; their malformed forms are sent.
In-bounds writes land in the segment's last `TAIL` bytes, which the probes' small objects never
reach (the allocator fills a segment from its start).

A prober thread meanwhile puts, gets (comparing every byte) and removes a fresh object and asks
the master for Stats every `probe_interval_s`; a step that raises a timeout or takes longer than
`hang_s` is a **hang**, one that fails otherwise a probe error. After the fuzz a **flood** opens
`cap + FLOOD_EXTRA` idle connections from another loopback address (127.0.0.2) to each server,
counts the refusals, runs a probe from 127.0.0.1 while they are held, closes half of them and
leaves the rest (and every half-open session) to the servers' sweeps. Then it waits, with a
deadline, for descriptors, threads and private RSS of both processes to come back within the
tolerances below of the baseline, and checks that the pool still serves: a 1 MiB put and get,
exact bytes, and Stats. **Crashes**: a server process that died, or a traceback in its log.

Tolerances (`Tolerance`): descriptors and threads must come back exactly (every connection is
closed by then; the transfer server's worker pool, at most `workers` threads, was filled by the
warm-up); private RSS (RSS minus shared pages: the node's segment is shared memory) may keep
`rss_mb` (12) MiB: the allocator keeps some of what a burst of hundreds of connections' buffers
took (up to 6 MiB on the transfer server, which keeps nothing per frame), while a leak of even
32 bytes a frame would show as 15 MiB over the half million frames a server takes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import click
import psutil

from kvpool.bench.fuzz_input import (
    FUZZ_SOURCE,
    HELLO,
    TAIL,
    Held,
    MessageFactory,
    Session,
    connect,
    connect_many,
    count_rpc_replies,
    count_transfer_replies,
    exchange,
    master_session,
    transfer_request,
    transfer_session,
)
from kvpool.bench.fuzz_plan import MiB, Plan, Tolerance
from kvpool.bench.fuzz_report import format_table
from kvpool.bench.rows import write_json
from kvpool.children import Child
from kvpool.client.store import Store
from kvpool.errors import KVPoolError
from kvpool.fdlimit import raise_fd_limit
from kvpool.protocol.framing import ERROR_FLAG, FrameDecoder
from kvpool.protocol.messages import (
    Response,
    Stats,
    StatsReply,
)
from kvpool.rpc.client import RpcClient
from kvpool.transfer.limits import ServerLimits

__all__ = ["Plan", "Tolerance", "command", "format_table", "run"]

log = logging.getLogger(__name__)

MAX_FRAME: Final = (1 << 32) - 1
#: Flood connections beyond each server's per-peer cap (each of them must be refused).
FLOOD_EXTRA: Final = 64
FLOOD_SOURCE: Final = "127.0.0.2"
#: Flood connections started at once: below the master's listen queue (asyncio's default 100,
#: tests/rpc/test_fuzz_found.py), so that the flood meets the per-peer cap, not SYN retries.
FLOOD_CHUNK: Final = 64
#: Where each kind of slowloris comes from (apart, so that neither meets the per-peer cap).
SLOW_SOURCES: Final = {"header": "127.0.0.3", "payload": "127.0.0.4"}


# ---------------------------------------------------------------- the processes

#: The delta rows: (metric, `Usage` field, unit, `Tolerance` field).
_USAGE_ROWS: Final = (
    ("rss_delta_mb", "private_rss", MiB, "rss_mb"),
    ("threads_delta", "threads", 1, "threads"),
    ("fds_delta", "fds", 1, "fds"),
)


@dataclass(slots=True)
class Usage:
    """What a server process holds."""

    private_rss: int
    rss: int
    threads: int
    fds: int

    @staticmethod
    def of(pid: int) -> Usage:
        p = psutil.Process(pid)
        mem = p.memory_info()
        return Usage(mem.rss - mem.shared, mem.rss, p.num_threads(), p.num_fds())


@dataclass(slots=True)
class Target:
    """One server under fire and what was seen of it."""

    name: str
    child: Child
    address: tuple[str, int]
    sessions: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    frames: int = 0
    replies_owed: int = 0
    replies_missing: int = 0
    missing_examples: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    baseline: Usage | None = None
    peak: Usage | None = None
    final: Usage | None = None


_TRACEBACK: Final = "Traceback (most recent call last)"


def _child(args: list[str], name: str, target: list[Target]) -> Child:
    """`python -m kvpool ARGS` whose logged tracebacks (a caught exception: `log.exception`)
    are kept, each as the log line before it and the exception's last line."""
    recent: list[str] = []
    open_tb: list[str] = []

    def on_line(line: str) -> None:
        if line.startswith(_TRACEBACK):
            open_tb[:] = [recent[-1] if recent else ""]
        elif open_tb and not line.startswith((" ", "\t")):
            if target:
                target[0].tracebacks.append(f"{open_tb[0][:200]} -> {line[:200]}")
            open_tb.clear()
        recent[:] = [line]

    return Child([sys.executable, "-m", "kvpool", *args], name=name, on_line=on_line)


def _unanswered(s: Session, got: bytearray, answered: int) -> str:
    """What a session that got too few replies sent and got (for the report)."""
    if not s.hello:  # a transfer session (pipelined in order): the count says it all
        return f"{s.kind}: {answered} of {s.replies} answered"
    ids = Counter(rid & ~ERROR_FLAG for rid, _ in FrameDecoder(MAX_FRAME).feed(bytes(got)))
    sent = FrameDecoder(MAX_FRAME).feed(s.data)
    lost = [(rid, p[:120]) for rid, p in sent if not ids[rid & ~ERROR_FLAG]]
    return f"{s.kind}: {answered} of {s.replies} answered; unanswered {lost[:3]!r}"


# ---------------------------------------------------------------- the run


@dataclass(slots=True)
class Probes:
    """What the prober saw; every field under `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    done: int = 0
    hangs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    slowest_s: float = 0.0


class Fuzz:
    """One run (see the module docstring): start, warm up, fuzz, flood, settle, check, stop."""

    def __init__(self, plan: Plan, tolerance: Tolerance | None = None) -> None:
        self.plan = plan
        self.tol = tolerance or Tolerance()
        self.probes = Probes()
        self.held = Held()
        self._held_lock = threading.Lock()
        self._stop = threading.Event()
        self._segment = ""
        self._address = ""
        self.flood: dict[str, dict[str, float]] = {}
        self.slow: dict[str, dict[str, Any]] = {}
        self.final_ok = False
        self.final_detail = ""
        self.seconds = 0.0
        self.settle_s = 0.0

    # ------------------------------------------------------------ probes

    def _probe(self, store: Store, i: int, into: Probes | None = None) -> None:
        """One put, get (exact bytes), remove, and Stats on a new connection (which also goes
        through the listener's accept under fire); a hang or an error is recorded in `into`
        (the run's probes by default)."""
        probes = self.probes if into is None else into
        size = 64 << 10
        key = f"fuzz-probe/{i}"
        value = random.Random(i).randbytes(size)

        def step(what: str, fn: Callable[[], Any]) -> Any:
            t0 = time.monotonic()
            try:
                return fn()
            except Exception as exc:
                took = time.monotonic() - t0
                timeout = isinstance(exc, TimeoutError) or (
                    isinstance(exc, KVPoolError) and exc.code.name.endswith("TIMEOUT")
                )
                with probes.lock:
                    (probes.hangs if timeout else probes.errors).append(
                        f"{what} #{i}: {type(exc).__name__}: {exc} ({took:.1f} s)"
                    )
                raise
            finally:
                took = time.monotonic() - t0
                with probes.lock:
                    probes.slowest_s = max(probes.slowest_s, took)
                    if took > self.plan.hang_s:
                        probes.hangs.append(f"{what} #{i} took {took:.1f} s")

        with contextlib.suppress(Exception):
            step("put", lambda: store.put(key, value))
            got = step("get", lambda: store.get(key))
            if got != value:
                with probes.lock:
                    probes.errors.append(f"get #{i}: wrong bytes")
            step("remove", lambda: store.remove(key, force=True))
        with contextlib.suppress(Exception):
            step("stats", self._stats)
        with probes.lock:
            probes.done += 1

    def _stats(self) -> StatsReply:
        with RpcClient(
            self._address, response_type=Response, timeout=self.plan.hang_s, unix=False
        ) as rpc:
            return rpc.call_as(Stats(), StatsReply)

    def _prober(self, store: Store) -> None:
        i = 1000
        while not self._stop.wait(self.plan.probe_interval_s):
            self._probe(store, i)
            i += 1

    # ------------------------------------------------------------ fuzzing

    def _run_session(
        self, target: Target, s: Session, count_replies: Callable[[bytearray], int]
    ) -> None:
        target.sessions[s.kind] += 1
        target.frames += s.frames
        if s.hold:
            with self._held_lock:
                if self.held.count(target.name) >= self.plan.max_held:
                    self.held.sweep()
                if self.held.count(target.name) >= self.plan.max_held:
                    target.sessions[s.kind] -= 1
                    target.frames -= s.frames
                    return
            try:
                sock = connect(target.address, FUZZ_SOURCE)
                if s.data:
                    sock.sendall(s.data)
            except OSError:
                target.outcomes["refused"] += 1
                return
            with self._held_lock:
                self.held.add(target.name, sock)
            target.outcomes["held"] += 1
            return
        outcome, got = exchange(target.address, s.data, self.plan.session_deadline_s, hello=s.hello)
        target.outcomes[outcome] += 1
        if s.replies >= 0 and outcome == "closed":
            n = count_replies(got)
            target.replies_owed += s.replies
            if n < s.replies:
                target.replies_missing += s.replies - max(n, 0)
                if len(target.missing_examples) < 5:
                    target.missing_examples.append(_unanswered(s, got, n))

    def _sessions(self, target: Target, seed: int) -> Iterator[Session]:
        rng = random.Random(f"{seed}-{target.name}")
        plan = self.plan
        if target.name == "master":
            factory = MessageFactory(rng, plan.huge_batch)
            while True:
                yield master_session(rng, factory, plan.max_batch)
        else:
            while True:
                yield transfer_session(rng, self._segment, plan.segment_size, plan.max_batch)

    def _fuzz(self, target: Target, seed: int, deadline: float, sessions: int | None) -> None:
        counter = count_rpc_replies if target.name == "master" else count_transfer_replies
        for i, s in enumerate(self._sessions(target, seed)):
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            if sessions is not None and i >= sessions:
                return
            self._run_session(target, s, counter)
            if sessions is None and target.frames >= self.plan.frames // 2:
                return  # each target gets half of the frames
            if not i % 64:
                self._track(target)

    def _track(self, target: Target) -> None:
        with contextlib.suppress(psutil.Error):
            now = Usage.of(target.child.pid)
            peak = target.peak
            target.peak = (
                now
                if peak is None
                else Usage(
                    max(peak.private_rss, now.private_rss),
                    max(peak.rss, now.rss),
                    max(peak.threads, now.threads),
                    max(peak.fds, now.fds),
                )
            )

    # ------------------------------------------------------------ flood

    def _slowloris(self, target: Target, store: Store, kind: str = "header") -> None:
        """Twice the transfer server's workers of connections (from SLOW_SOURCES), each with part
        of a request header (`header`; a `Hello` at the master) or a whole WRITE header and no
        payload (`payload`), then silent, held while one probe runs: how long a well-formed
        client waits behind them. Left to the servers' limits afterwards."""
        n = min(2 * ServerLimits().workers, self.plan.per_peer)
        held = Held()
        name = self._segment.encode()
        if target.name == "master":
            data = HELLO[:9]
        elif kind == "header":
            data = transfer_request(1, name, 0, 8)[:9]
        else:
            data = transfer_request(2, name, self.plan.segment_size - TAIL, 4096)
        label = f"slow-{kind}-{target.name}"
        for _ in range(n):
            with contextlib.suppress(OSError):
                sock = connect(target.address, SLOW_SOURCES[kind])
                sock.sendall(data)
                held.add(label, sock)
        time.sleep(1.0)  # long enough for the poller to hand each one to a worker
        t0 = time.monotonic()
        probe = Probes()  # reported in this row, not in the run's hangs and probe errors
        self._probe(store, 800_000 + len(self.slow), probe)
        self.slow[f"{target.name}/{kind}"] = {
            "target": target.name,
            "kind": kind,
            "connections": held.opened[label],
            "probe_s": round(time.monotonic() - t0, 3),
            "probe_failed": bool(probe.errors or probe.hangs),
            "probe_errors": probe.errors + probe.hangs,
        }
        if kind == "payload":
            # They hold workers until the stall timeout: let that pass before what follows
            # (the flood's probe) is measured.
            deadline = time.monotonic() + self.plan.hang_s
            while held.sweep() and time.monotonic() < deadline:
                time.sleep(0.1)  # polling sockets the server closes; nothing to wait on
        with self._held_lock:
            self.held.take(held)

    def _flood(self, target: Target, store: Store) -> None:
        """`per_peer + FLOOD_EXTRA` idle connections from FLOOD_SOURCE: refusals counted, a
        probe from 127.0.0.1 while they are held, half closed by us, half left to the sweep."""
        n = self.plan.per_peer + FLOOD_EXTRA
        flood = Held()
        label = f"flood-{target.name}"
        t0 = time.monotonic()
        socks, failed = connect_many(
            target.address, FLOOD_SOURCE, n, self.plan.hang_s, chunk=FLOOD_CHUNK
        )
        open_s = time.monotonic() - t0
        for sock in socks:
            flood.add(label, sock)
        # A refused connection gets its answer and a close at once; the others stay silent
        # until the server's first-request or handshake limit.
        deadline = time.monotonic() + 15.0  # refusals arrive late on a loaded machine
        while time.monotonic() < deadline:
            flood.sweep()
            if flood.refused[label] >= n - self.plan.per_peer - failed:
                break
            time.sleep(0.05)  # polling sockets the server closes; nothing to wait on
        refused = flood.refused[label]
        # Held connections the server closed without a refusal meanwhile (its handshake limit
        # on a slow machine): each freed a place under the cap that a later one may take.
        silent = flood.closed_by_server[label] - refused
        self._probe(store, 900_000 + len(self.flood))
        closed_by_us = flood.close_some(label, 0.5)
        with self._held_lock:
            self.held.take(flood)
        self.flood[target.name] = {
            "opened": n - failed,
            "connect_failed": failed,
            "refused": refused,
            "closed_silently": silent,
            "closed_by_us": closed_by_us,
            "cap": self.plan.per_peer,
            "open_s": round(open_s, 3),
        }

    # ------------------------------------------------------------ run

    def run(self) -> list[dict[str, Any]]:
        plan = self.plan
        raise_fd_limit()
        targets: list[Target] = []
        master_ref: list[Target] = []
        node_ref: list[Target] = []
        master: Child | None = None
        node: Child | None = None
        store: Store | None = None
        threads: list[threading.Thread] = []
        t_begin = time.monotonic()
        idle = f"{plan.idle_timeout_s:g}s"
        first = f"{plan.first_byte_timeout_s:g}s"
        peer = str(plan.per_peer)
        try:
            master = _child(
                [
                    "master",
                    "--port",
                    "0",
                    "--no-unix-socket",
                    "--rpc-idle-timeout",
                    idle,
                    "--rpc-handshake-timeout",
                    first,
                    "--max-connections-per-peer",
                    peer,
                ],
                "fuzz master",
                master_ref,
            )
            host, port = master.wait_ready(60).rsplit(":", 1)
            address = self._address = f"{host}:{port}"
            node = _child(
                [
                    "node",
                    "--master",
                    address,
                    "--segment-size",
                    str(plan.segment_size),
                    "--no-progress",
                    "--transfer-idle-timeout",
                    idle,
                    "--transfer-first-request-timeout",
                    first,
                    "--transfer-max-connections-per-peer",
                    peer,
                ],
                "fuzz node",
                node_ref,
            )
            nhost, nport = node.wait_ready(60).rsplit(":", 1)
            master_ref.append(Target("master", master, (host, int(port))))
            node_ref.append(Target("transfer", node, (nhost, int(nport))))
            targets = [master_ref[0], node_ref[0]]
            stats = self._stats()
            self._segment = next(s.name for s in stats.segments if s.endpoint == f"{nhost}:{nport}")
            store = Store(address, protocol="tcp", rpc_timeout=5.0, transfer_timeout=plan.hang_s)
            # Warm-up: every kind of input, then the workers and buffers a burst takes.
            for t in targets:
                self._fuzz(t, plan.seed + 1, math.inf, plan.warmup_sessions)
            self._probe(store, 1)
            self._fill_workers(node_ref[0])
            self._wait_swept(targets, plan.settle_s)
            self.held.sweep()
            for t in targets:
                t.baseline = Usage.of(t.child.pid)
                t.sessions.clear()
                t.outcomes.clear()
                t.frames = t.replies_owed = t.replies_missing = 0
            # The fuzz.
            t0 = time.monotonic()
            deadline = t0 + plan.seconds
            prober = threading.Thread(
                target=self._prober, args=(store,), name="fuzz-probe", daemon=True
            )
            prober.start()
            threads.append(prober)
            for t in targets:
                th = threading.Thread(
                    target=self._fuzz,
                    args=(t, plan.seed, deadline, None),
                    name=f"fuzz-{t.name}",
                    daemon=True,
                )
                th.start()
                threads.append(th)
            for th in threads[1:]:
                th.join()
            self.seconds = time.monotonic() - t0
            self._stop.set()
            prober.join()
            for t in targets:
                self._slowloris(t, store)
                if t.name == "transfer":
                    self._slowloris(t, store, "payload")
                self._flood(t, store)
            t1 = time.monotonic()
            self._wait_swept(targets, plan.settle_s)
            self.settle_s = time.monotonic() - t1
            self.held.sweep()
            for t in targets:
                if t.child.alive():
                    t.final = Usage.of(t.child.pid)
            self._final_check(store)
            return self._rows(targets, time.monotonic() - t_begin)
        finally:
            self._stop.set()
            for th in threads:
                th.join(timeout=plan.session_deadline_s + 5)
            self.held.close()
            if store is not None:
                store.close()
            if node is not None:
                node.stop()
            if master is not None:
                master.stop()

    def _fill_workers(self, target: Target) -> None:
        """Start every worker thread of the transfer server (a pool bounded by `workers` that
        never shrinks): that many connections each holding one with a READ of 16 MiB that it
        never reads (its worker waits in the send), until the thread count stops growing, then
        closed. (A WRITE whose payload does not come no longer holds a worker while others
        wait: the server hands it back to its poller.)"""
        pid = target.child.pid
        socks = []
        name = self._segment.encode()
        length = min(16 * MiB, self.plan.segment_size)
        try:
            for _ in range(ServerLimits().workers):
                sock = connect(target.address, FUZZ_SOURCE)
                socks.append(sock)
                sock.sendall(transfer_request(1, name, 0, length))
            last, since = psutil.Process(pid).num_threads(), time.monotonic()
            while time.monotonic() - since < 1.0:
                time.sleep(0.05)  # polling /proc; nothing to wait on
                now = psutil.Process(pid).num_threads()
                if now != last:
                    last, since = now, time.monotonic()
        finally:
            for sock in socks:
                sock.close()

    def _wait_swept(self, targets: list[Target], deadline_s: float) -> None:
        """Until both servers are back within tolerance of their baseline (or, before there is
        one, until no fuzz connection is left open), or `deadline_s`."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            open_left = self.held.sweep()
            ok = open_left == 0
            for t in targets:
                if not t.child.alive():
                    return
                if t.baseline is not None:
                    now = Usage.of(t.child.pid)
                    ok = ok and (
                        now.fds - t.baseline.fds <= self.tol.fds
                        and now.threads - t.baseline.threads <= self.tol.threads
                        and (now.private_rss - t.baseline.private_rss) / MiB <= self.tol.rss_mb
                    )
            if ok:
                return
            time.sleep(0.2)  # polling /proc and the held sockets; nothing to wait on

    def _final_check(self, store: Store) -> None:
        """A 1 MiB put and get through the prober's Store, and Stats."""
        try:
            value = random.Random(self.plan.seed).randbytes(MiB)
            store.put("fuzz-final", value)
            got = store.get("fuzz-final")
            stats = self._stats()
            self.final_ok = got == value and len(stats.segments) == 1
            self.final_detail = (
                f"1 MiB put+get exact: {got == value}; Stats: {len(stats.segments)} segment(s), "
                f"{stats.objects} object(s)"
            )
        except Exception as exc:
            self.final_detail = f"{type(exc).__name__}: {exc}"

    # ------------------------------------------------------------ rows

    def _rows(self, targets: list[Target], total_s: float) -> list[dict[str, Any]]:
        plan = self.plan

        def row(metric: str, value: Any, **extra: Any) -> dict[str, Any]:
            return {"system": "kvpool", "metric": metric, "value": value, **extra}

        crashes = [t for t in targets if not t.child.alive()]
        rows = [
            row(
                "scenario_s",
                round(total_s, 1),
                fuzz_s=round(self.seconds, 1),
                settle_s=round(self.settle_s, 1),
                seed=plan.seed,
                frames_planned=plan.frames,
                seconds_planned=plan.seconds,
                idle_timeout_s=plan.idle_timeout_s,
                per_peer=plan.per_peer,
            )
        ]
        rows.append(
            row(
                "crashes",
                len(crashes) + sum(len(t.tracebacks) > 0 for t in targets if t not in crashes),
                died=[t.name for t in crashes],
                tracebacks={t.name: t.tracebacks[:5] for t in targets if t.tracebacks},
            )
        )
        with self.probes.lock:
            rows.append(
                row(
                    "hangs",
                    len(self.probes.hangs),
                    probes=self.probes.done,
                    hang_s=plan.hang_s,
                    slowest_s=round(self.probes.slowest_s, 3),
                    examples=self.probes.hangs[:5],
                )
            )
            rows.append(
                row("probe_errors", len(self.probes.errors), examples=self.probes.errors[:5])
            )
        rows.append(row("serves_after", int(self.final_ok), detail=self.final_detail))
        rows.append(
            row(
                "held_closed_by_server",
                sum(self.held.closed_by_server.values()),
                opened=dict(self.held.opened),
                closed_by_server=dict(self.held.closed_by_server),
                closed_by_us=dict(self.held.closed_by_us),
            )
        )
        for t in targets:
            flood = self.flood.get(t.name, {})
            rows += [
                row(
                    "frames",
                    t.frames,
                    target=t.name,
                    frames_per_s=round(t.frames / self.seconds) if self.seconds else None,
                    sessions=dict(t.sessions),
                    outcomes=dict(t.outcomes),
                ),
                row(
                    "replies_missing",
                    t.replies_missing,
                    target=t.name,
                    owed=t.replies_owed,
                    examples=t.missing_examples,
                ),
                row("flood", flood.get("opened", 0), target=t.name, **flood),
            ]
            rows += [
                row("slowloris_probe_s", slow["probe_s"], **slow)
                for slow in self.slow.values()
                if slow["target"] == t.name
            ]
            b, f, p = t.baseline, t.final, t.peak
            if b is None or f is None:
                continue
            for metric, attr, unit, tol in _USAGE_ROWS:

                def amount(u: Usage | None, attr: str = attr, unit: int = unit) -> float | None:
                    return None if u is None else round(getattr(u, attr) / unit, 2)

                rows.append(
                    row(
                        metric,
                        round((getattr(f, attr) - getattr(b, attr)) / unit, 2),
                        target=t.name,
                        baseline=amount(b),
                        peak=amount(p),
                        tolerance=getattr(self.tol, tol),
                    )
                )
        return rows


def run(
    quick: bool = False,
    frames: int | None = None,
    seconds: float | None = None,
    seed: int = 15,
    tolerance: Tolerance | None = None,
) -> list[dict[str, Any]]:
    """Run the benchmark and return its rows."""
    plan = Plan.of(
        quick,
        frames if frames is not None else (200_000 if quick else 1_000_000),
        seconds if seconds is not None else (4.0 if quick else 120.0),
        seed,
    )
    return Fuzz(plan, tolerance).run()


@click.command()
@click.option(
    "--frames",
    type=click.IntRange(1),
    default=None,
    help="Frames to send in all [default: 1,000,000; 200,000 with --quick].",
)
@click.option(
    "--seconds",
    type=click.FloatRange(0.1),
    default=None,
    help="Time budget of the fuzz [default: 120; 4 with --quick].",
)
@click.option("--seed", type=int, default=15, show_default=True, help="Seed of every generator.")
@click.option(
    "--quick", is_flag=True, help="Small caps, short timeouts, a few seconds (the tests)."
)
@click.option("--json", "json_path", default=None, help="Write the rows as JSON to this file.")
def command(
    *, frames: int | None, seconds: float | None, seed: int, quick: bool, json_path: str | None
) -> None:
    """Random, truncated, oversized and wrong frames, half-open connections and a flood at a
    master and a node; both must still serve and come back to their baseline."""
    rows = run(quick=quick, frames=frames, seconds=seconds, seed=seed)
    click.echo(format_table(rows))
    if json_path:
        write_json(json_path, rows)
