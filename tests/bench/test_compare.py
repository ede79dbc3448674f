"""`kvpool bench compare`: the harness runs every installed system, verifies every byte it reads,
reports what is missing, and leaves no process behind. It never asserts speed.

The real Mooncake starts only with KVPOOL_TEST_REAL_MOONCAKE=1: its client-side TCP listener
binds every interface, which a test suite must not do by default.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from kvpool.bench.compare import CompareOptions, Progress, run_compare
from kvpool.bench.peers.base import BenchError, Driver, Unavailable
from kvpool.bench.peers.limits import MemcpyDriver, SocketDriver
from kvpool.bench.peers.workload import RunPlan, plan_cases, run_cases
from kvpool.bench.rows import RATE_FIELDS
from kvpool.override import override
from kvtest.procs import Proc, kvpool_proc, require_binary, wait_until

REQUIRED = RATE_FIELDS
SIZES = (4096, 1 << 20, 16 << 20)


def _systems() -> str:
    real = os.environ.get("KVPOOL_TEST_REAL_MOONCAKE") == "1"
    return "kvpool,mooncake,redis,limit" if real else "kvpool,redis,limit"


def _quiet() -> Progress:
    return Progress(io.StringIO())


class DictDriver(Driver):
    """An in-process store that refuses to overwrite, like Mooncake's put."""

    system = "fake"
    path = "dict"

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, bytes] = {}
        self.resets = 0

    @override
    def setup(self, capacity: int) -> None:
        pass

    @override
    def put(self, key: str, value: memoryview) -> None:
        if key in self.data:
            raise BenchError(f"{key} put twice without a reset")
        self.data[key] = bytes(value)

    @override
    def get(self, key: str, out: memoryview) -> memoryview | bytes:
        return self.data[key]

    @override
    def batch_put(self, keys: Sequence[str], values: Sequence[memoryview]) -> None:
        for k, v in zip(keys, values, strict=True):
            self.put(k, v)

    @override
    def batch_get(self, keys: Sequence[str], outs: Sequence[memoryview]) -> list[bytes]:
        return [self.data[k] for k in keys]

    @override
    def reset(self) -> None:
        self.data.clear()
        self.resets += 1

    @override
    def teardown(self) -> None:
        self.data.clear()


class CorruptingDriver(DictDriver):
    """Returns one wrong byte in the n-th value read."""

    def __init__(self, nth: int) -> None:
        super().__init__()
        self.reads = 0
        self.nth = nth

    @override
    def get(self, key: str, out: memoryview) -> memoryview | bytes:
        self.reads += 1
        value = self.data[key]
        if self.reads == self.nth:
            pos = len(value) // 2
            value = value[:pos] + bytes([value[pos] ^ 0xFF]) + value[pos + 1 :]
        return value


class MissingDriver(DictDriver):
    system = "absent"

    @override
    def setup(self, capacity: int) -> None:
        raise Unavailable("not installed here", "apt-get install absent")


def test_cases_cover_single_ops_for_every_size_and_batches_for_small_ones() -> None:
    cases = plan_cases(SIZES, 64, 256 << 20)
    assert [(c.value_size, c.batch) for c in cases] == [
        (4096, 1),
        (4096, 64),
        (1 << 20, 1),
        (16 << 20, 1),
    ]
    for c in cases:
        assert c.n_keys * c.value_size <= 256 << 20  # the memory bound holds
        assert c.n_keys % c.batch == 0


def test_every_timed_put_is_an_insert_and_every_read_is_checked() -> None:
    driver = DictDriver()
    cases = plan_cases((4096,), 8, 64 << 10)  # 16 keys per fill: the key set wraps often
    results = run_cases([driver], cases, RunPlan(rounds=2, seconds_per_phase=0.05))
    assert driver.resets > 4  # the put phase ran past one fill and reset before reusing keys
    ops = {(m.op, m.batch) for m in results}
    assert ops == {("put", 1), ("get", 1), ("put", 8), ("get", 8)}
    assert all(m.ops_per_s > 0 and m.calls > 0 and m.rounds == 2 for m in results)


def test_a_wrong_byte_stops_the_benchmark() -> None:
    cases = plan_cases((1 << 20,), 1, 8 << 20)
    with pytest.raises(BenchError, match="wrong bytes: first difference at offset 524288"):
        run_cases([CorruptingDriver(nth=3)], cases, RunPlan(rounds=1, seconds_per_phase=0.05))


def test_an_uninstalled_system_is_reported_as_skipped_with_its_install_command() -> None:
    opts = CompareOptions(sizes=[4096], batch=4, seconds=0.02, rounds=1, round_bytes=1 << 20)
    results, skipped = run_compare(opts, _quiet(), drivers=[MissingDriver(), DictDriver()])
    assert [(s.label, s.install) for s in skipped] == [("absent/dict", "apt-get install absent")]
    assert {m.system for m in results} == {"fake"}


def test_limit_drivers_move_exact_bytes_and_stop_their_server() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    opts = CompareOptions(
        sizes=[4096, 1 << 20], batch=16, seconds=0.1, rounds=2, round_bytes=8 << 20
    )
    results, skipped = run_compare(opts, _quiet(), drivers=[MemcpyDriver(), SocketDriver()])
    assert not skipped
    assert {m.label for m in results} == {"limit/memcpy", "limit/socket"}
    assert len(results) == 2 * 2 * 3  # 2 drivers x (put, get) x (4 KiB, 16 x 4 KiB, 1 MiB)
    after = {p.pid for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert after <= before


def test_socket_limit_server_drops_a_client_that_asks_outside_its_arena() -> None:
    import socket
    import struct

    with Proc(
        [sys.executable, "-m", "kvpool.bench.peers.limits", "4096"], name="limit-server"
    ) as server:
        host, port = server.wait_ready().split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(struct.pack("<B3xI", 2, 1) + struct.pack("<QQ", 4000, 4096))
            assert s.recv(1) == b""  # closed, nothing served
        with socket.create_connection((host, int(port)), timeout=10) as s:  # still serving
            s.sendall(struct.pack("<B3xI", 1, 1) + struct.pack("<QQ", 0, 3) + b"abc")
            assert s.recv(1) == b"\x01"


@pytest.mark.slow
def test_quick_run_writes_json_rows_and_a_plot(tmp_path: Path) -> None:
    require_binary("redis-server")
    out_json = str(tmp_path / "rows.json")
    out_png = str(tmp_path / "plot.png")
    out_md = str(tmp_path / "table.md")
    with kvpool_proc(
        "bench",
        "compare",
        "--quick",
        "--systems",
        _systems(),
        "--json",
        out_json,
        "--plot",
        out_png,
        "--markdown",
        out_md,
        name="bench compare",
    ) as proc:
        rc = proc.popen.wait(timeout=240)
        assert rc == 0, proc.output()
    with open(out_json, encoding="utf-8") as f:
        rows = json.load(f)
    measured = [r for r in rows if "metric" not in r]
    assert all(set(r) >= REQUIRED for r in measured)
    labels = {(r["system"], r["path"]) for r in measured}
    assert {("redis", "tcp"), ("limit", "memcpy"), ("limit", "socket")} <= labels
    if "mooncake" in _systems():
        assert ("mooncake", "tcp") in labels, proc.output()
    for label in labels:
        cases = {
            (r["op"], r["value_size"], r["batch"])
            for r in measured
            if (r["system"], r["path"]) == label
        }
        assert cases == {(op, s, 1) for op in ("put", "get") for s in SIZES} | {
            ("put", 4096, 64),
            ("get", 4096, 64),
        }
    assert all(r["ops_per_s"] > 0 and r["p99_us"] >= r["p50_us"] > 0 for r in measured)
    if ("kvpool", "shm") in labels:
        ratios = [r for r in rows if r.get("metric") == "ratio"]
        assert {r["peer"] for r in ratios} >= {"redis/tcp", "limit/memcpy", "limit/socket"}
        # Strict and the fast modes side by side; every kvpool row says which it ran in.
        assert {("kvpool", "shm+fast"), ("kvpool", "tcp+fast")} <= labels
        modes = {(r["path"], r["op"], r["mode"]) for r in measured if r["system"] == "kvpool"}
        assert modes == {
            (path, op, mode)
            for path, fast in (
                ("shm", False),
                ("tcp", False),
                ("shm+fast", True),
                ("tcp+fast", True),
            )
            for op, mode in (
                ("put", "nowait" if fast else "strict"),
                ("get", "cached" if fast else "strict"),
            )
        }
        assert all("mode" in r for r in ratios if r["system"] == "kvpool")
    else:  # kvpool's client not built yet: it must say so, not vanish
        assert "skipped: kvpool/shm: kvpool.client not available" in proc.output()
    with open(out_png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(out_md, encoding="utf-8") as f:
        md = f.read()
    assert "| put | 16 MiB | limit/socket |" in md and "targets (" in md


@pytest.mark.slow
def test_sigterm_mid_run_stops_every_child() -> None:
    require_binary("redis-server")
    proc = kvpool_proc(
        "bench",
        "compare",
        "--systems",
        "kvpool,redis,limit",
        "--seconds",
        "30",
        name="bench compare",
    )
    try:
        bench = psutil.Process(proc.pid)

        def children_up() -> list[psutil.Process]:
            kids = bench.children(recursive=True)
            names = " ".join(" ".join(k.cmdline()) for k in kids)
            wanted = ("redis-server", "kvpool.bench.peers.limits", "kvpool master", "kvpool node")
            return kids if all(w in names for w in wanted) else []

        kids = wait_until(children_up, timeout=90, what="every system's processes")
        proc.wait_for_line(r"round 1", timeout=60)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.popen.wait(timeout=30) != 0
        _gone, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive, [k.cmdline() for k in alive]
    finally:
        proc.stop()


class LazyDriver(DictDriver):
    """Writes a value into the caller's buffer once, then returns the buffer untouched."""

    def __init__(self) -> None:
        super().__init__()
        self.served: set[str] = set()

    @override
    def get(self, key: str, out: memoryview) -> memoryview:
        value = self.data[key]
        if key not in self.served:
            out[: len(value)] = value
            self.served.add(key)
        return out[: len(value)]

    @override
    def reset(self) -> None:
        super().reset()
        self.served.clear()  # so only a repeated read within one get phase is lazy


def test_a_get_that_writes_nothing_is_caught_even_when_one_key_is_read_again() -> None:
    cases = plan_cases((1 << 20,), 1, 1 << 20)  # one key per fill: the same key read repeatedly
    assert cases[0].n_keys == 1
    with pytest.raises(BenchError, match="wrong bytes"):
        run_cases([LazyDriver()], cases, RunPlan(rounds=1, seconds_per_phase=0.05))


def test_kvpools_own_mooncake_shim_is_not_measured_as_mooncake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvpool.bench.peers import mooncake_peer

    fake = tmp_path / "mooncake"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "store.py").write_text("class MooncakeDistributedStore:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MC_LOG_LEVEL", "ERROR")  # what the driver would set; restored after
    for name in [m for m in sys.modules if m == "mooncake" or m.startswith("mooncake.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        with pytest.raises(Unavailable, match="is not the real Mooncake"):
            mooncake_peer.MooncakeDriver().setup(1 << 20)
    finally:
        # The fake package must not outlive this test in sys.modules: later tests ask
        # importlib whether a real Mooncake is installed.
        for name in [m for m in sys.modules if m == "mooncake" or m.startswith("mooncake.")]:
            del sys.modules[name]


@pytest.mark.slow
def test_a_benchmark_killed_with_sigkill_leaves_no_server_behind() -> None:
    require_binary("redis-server")
    proc = kvpool_proc(
        "bench", "compare", "--systems", "redis,limit", "--seconds", "30", name="bench compare"
    )
    try:
        bench = psutil.Process(proc.pid)

        def servers() -> list[psutil.Process]:
            kids = bench.children(recursive=True)
            names = " ".join(" ".join(k.cmdline()) for k in kids)
            return kids if "redis-server" in names and "kvpool.bench.peers.limits" in names else []

        kids = wait_until(servers, timeout=60, what="redis-server and the socket server")
        proc.kill9()  # no finally runs: only PR_SET_PDEATHSIG can stop the children now
        _gone, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive, [k.cmdline() for k in alive]
    finally:
        proc.stop()


def test_the_thin_script_runs_the_same_command() -> None:
    script = Path(__file__).parents[2] / "benchmarks" / "compare.py"
    with Proc([sys.executable, str(script), "--help"], name="benchmarks/compare.py") as p:
        assert p.popen.wait(timeout=60) == 0
        p.wait_for_line(r"--markdown", timeout=10)


class TwoWayDriver(DictDriver):
    """A store with a slow and a fast way to get; the harness must measure the fast one."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {"slow": 0, "fast": 0}

    @override
    def apis(self, op: str, batched: bool) -> tuple[str, ...]:
        return ("slow", "fast") if op == "get" else ("plain",)

    @override
    def get(self, key: str, out: memoryview) -> memoryview | bytes:
        api = self.api("get", False)
        self.calls[api] += 1
        if api == "slow":
            deadline = time.perf_counter() + 0.002
            while time.perf_counter() < deadline:  # busy: a slower call, not a wait
                pass
        return self.data[key]


def test_the_fastest_of_a_systems_apis_is_measured_and_named() -> None:
    driver = TwoWayDriver()
    cases = plan_cases((4096,), 1, 1 << 20)
    results = run_cases([driver], cases, RunPlan(rounds=1, seconds_per_phase=0.05))
    apis = {m.op: m.api for m in results}
    assert apis == {"put": "plain", "get": "fast"}
    assert driver.calls["slow"] == 2 * RunPlan(1, 0).warmup_calls  # only at warm-up
