"""Cases, values, the interleaved timing loop and byte-exact verification of `bench compare`.

How a run goes (`run_cases`):

* Each case is a value size and a batch (1 = single put/get), measured for put and for get.
* For each case, `rounds` short rounds; in each round every driver takes its turn, in an order
  rotated by one each round, so that a drift of the shared machine (another engineer's build)
  hits every system alike, whichever runs first.
* A turn is a put phase then a get phase of `seconds_per_phase` each. The put phase writes fresh
  keys one by one (or one batch per call); when the bounded key set is used up it `reset`s
  (not timed) and starts over with new values, so every timed put is an insert, also for stores
  whose put does not overwrite (Mooncake). The get phase reads back the keys of the last fill,
  cycling, and compares every value read with what was written, byte by byte: a wrong byte
  raises `BenchError`.
* Only the calls are timed (`perf_counter_ns` around each), not the verification. Throughput of
  a turn is keys moved / timed seconds; a case reports the median over rounds, and p50/p99 of
  the per-call latencies pooled over all rounds (for batches, the latency of the whole call).

Values: a random base buffer per size; the value of key j in fill f is the slice of the base at
an offset that depends on (f, j), so values differ between keys and between fills (a store that
returns another key's bytes, or stale bytes, fails verification) without copying anything.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvpool.bench.peers.base import BenchError, Driver, Read
from kvpool.bench.rows import percentile

__all__ = [
    "Case",
    "Measurement",
    "RunPlan",
    "ValueSource",
    "capacity_for",
    "case_name",
    "page_aligned",
    "plan_cases",
    "run_cases",
    "size_name",
    "verify",
]

# Values start at page multiples of one random buffer: 4096 distinct values per size and fill.
# Page-aligned like the pinned buffers an engine would use, and not as a trick: numpy and
# bytearray put large buffers 16 bytes past a page boundary, and a copy whose destination sits
# just past its source modulo 4 KiB runs several times slower in glibc on these CPUs (found by
# the client's authors, commit 854f4b6), which would tax whichever system happened to hit it.
_PAGE = 4096
_SLOT_STEP = _PAGE
_SLOTS = 4096
# Per-phase bound on calls, so a loop can never run away even if the clock misbehaves.
_MAX_CALLS_PER_PHASE = 2_000_000
# Below this, comparing two `bytes` is cheaper than building numpy views.
_SMALL = 64 << 10


@dataclass(frozen=True, slots=True)
class Case:
    """One workload: values of `value_size` bytes, `batch` keys per call, `n_keys` per fill."""

    value_size: int
    batch: int
    n_keys: int

    @property
    def n_calls(self) -> int:
        """Calls that write the whole key set once."""
        return self.n_keys // self.batch

    def key(self, j: int) -> str:
        return f"cmp-{self.value_size}-{self.batch}-{j}"


@dataclass(frozen=True, slots=True)
class RunPlan:
    """How long and how often: `rounds` turns per driver per case, each phase this long."""

    rounds: int
    seconds_per_phase: float
    warmup_calls: int = 16
    """Untimed calls per API (twice, interleaved) before the rounds; see `_calibrate`. Six
    were too few to tell apart two APIs within a tenth of each other on a noisy machine (the
    slower of kvpool's `put` and `put_from` was measured in some runs)."""


@dataclass(slots=True)
class Measurement:
    """What one driver did for one (case, op), aggregated over the rounds."""

    system: str
    path: str
    op: str
    value_size: int
    batch: int
    ops_per_s: float
    bytes_per_s: float
    p50_us: float
    p99_us: float
    rounds: int
    calls: int
    api: str = ""
    """The client call that was measured (the fastest of the driver's `apis`)."""
    mode: str = ""
    """kvpool's Store mode for this op ("strict", "cached", ...; `Driver.mode`)."""

    @property
    def label(self) -> str:
        return f"{self.system}/{self.path}"


def page_aligned(n: int) -> npt.NDArray[np.uint8]:
    """`n` bytes of numpy memory starting on a 4 KiB boundary (not yet touched)."""
    raw = np.empty(n + _PAGE, dtype=np.uint8)
    start = (-raw.ctypes.data) % _PAGE
    return raw[start : start + n]


def plan_cases(sizes: Sequence[int], batch: int, round_bytes: int) -> list[Case]:
    """Single put/get for every size, and batches of `batch` for sizes below 1 MiB.

    The key set of a fill is bounded by `round_bytes` (and by the 4096 distinct values), so the
    memory every store holds at once stays modest whatever the speed of the system.
    """
    cases: list[Case] = []
    for size in sizes:
        n = max(1, min(_SLOTS, round_bytes // size))
        cases.append(Case(size, 1, n))
        if batch > 1 and size < (1 << 20):
            nb = max(1, min(_SLOTS, round_bytes // size) // batch)
            cases.append(Case(size, batch, nb * batch))
    return cases


def capacity_for(cases: Sequence[Case]) -> int:
    """Bytes a store must hold at once for these cases (one fill of the largest)."""
    return max(c.n_keys * c.value_size for c in cases)


class ValueSource:
    """Distinct, verifiable values for every (fill, key) of a case, as views of one buffer."""

    def __init__(self, case: Case, seed: int = 20261130) -> None:
        self.case = case
        rng = np.random.default_rng(seed + case.value_size)
        span = case.value_size + _SLOTS * _SLOT_STEP
        self._base = page_aligned(span)
        self._base[:] = rng.integers(0, 256, size=span, dtype=np.uint8)
        self._view = memoryview(self._base.data).cast("B")
        # Destination buffers for gets, pre-faulted (first-touch faults are slow here).
        self._outs = page_aligned(case.batch * case.value_size)
        self._outs.fill(0)
        self._outs_view = memoryview(self._outs.data).cast("B")
        size = case.value_size
        self.outs = [self._outs_view[i * size : (i + 1) * size] for i in range(case.batch)]

    def poison_outs(self) -> None:
        """Overwrite the get buffers, so that a get which writes nothing cannot pass for one
        that read the same key into the same buffer the call before."""
        self._outs.fill(0xA5)

    @property
    def buffers(self) -> tuple[memoryview, memoryview]:
        """The two buffers every value and every destination lies in (for `Driver.register`)."""
        return self._view, self._outs_view

    def value(self, fill: int, j: int) -> memoryview:
        off = ((fill * 7919 + j) % _SLOTS) * _SLOT_STEP
        return self._view[off : off + self.case.value_size]

    def call(self, fill: int, call: int) -> tuple[list[str], list[memoryview]]:
        """Keys and values of the `call`-th call of a fill."""
        b = self.case.batch
        js = range(call * b, (call + 1) * b)
        return [self.case.key(j) for j in js], [self.value(fill, j) for j in js]


def verify(label: str, key: str, got: Read, want: memoryview) -> None:
    """Raise `BenchError` unless `got` is byte for byte `want`."""
    if len(got) != len(want):
        raise BenchError(f"{label}: {key!r} read {len(got)} bytes, {len(want)} were written")
    if len(want) <= _SMALL:
        if bytes(got) == bytes(want):
            return
    else:
        a = np.frombuffer(got, dtype=np.uint8)
        b = np.frombuffer(want, dtype=np.uint8)
        if np.array_equal(a, b):
            return
    a = np.frombuffer(got, dtype=np.uint8)
    b = np.frombuffer(want, dtype=np.uint8)
    first = int(np.flatnonzero(a != b)[0])
    raise BenchError(
        f"{label}: {key!r} read wrong bytes: first difference at offset {first} of {len(want)}"
    )


@dataclass(slots=True)
class _Turns:
    """Samples of one (driver, case, op) across rounds."""

    rates: list[float] = field(default_factory=list)
    latencies_ns: list[int] = field(default_factory=list)


class _Fills:
    """Counts fills per case so values never repeat between turns of a driver."""

    def __init__(self) -> None:
        self._n = 0

    def next(self) -> int:
        self._n += 1
        return self._n


def _put_phase(
    driver: Driver, src: ValueSource, fills: _Fills, seconds: float, turns: _Turns | None
) -> tuple[int, int]:
    """Timed puts until `seconds` pass; returns (fill, calls of that fill that are stored)."""
    case = src.case
    fill, j, calls, timed_ns = fills.next(), 0, 0, 0
    deadline = time.perf_counter() + seconds
    keys_done = 0
    while calls < _MAX_CALLS_PER_PHASE:
        if j == case.n_calls:
            driver.reset()  # not timed: a fresh key set, so the next puts insert again
            fill, j = fills.next(), 0
        keys, values = src.call(fill, j)
        t0 = time.perf_counter_ns()
        if case.batch == 1:
            driver.put(keys[0], values[0])
        else:
            driver.batch_put(keys, values)
        dt = time.perf_counter_ns() - t0
        j += 1
        calls += 1
        keys_done += case.batch
        timed_ns += dt
        if turns is not None:
            turns.latencies_ns.append(dt)
        if time.perf_counter() >= deadline:
            break
    if turns is not None:
        turns.rates.append(keys_done / max(timed_ns, 1) * 1e9)
    return fill, j


def _get_phase(
    driver: Driver,
    src: ValueSource,
    stored: tuple[int, int],
    seconds: float,
    turns: _Turns | None,
) -> None:
    """Timed gets of the stored calls, cycling, each value verified (verification not timed)."""
    case = src.case
    fill, n_stored = stored
    deadline = time.perf_counter() + seconds
    i, calls, timed_ns, keys_done = 0, 0, 0, 0
    while calls < _MAX_CALLS_PER_PHASE:
        keys, values = src.call(fill, i)
        if n_stored == 1:
            # Re-reading one call's keys: stale bytes in the buffers would be the right ones.
            # With two or more, the buffers hold another key's (different) bytes already.
            src.poison_outs()
        t0 = time.perf_counter_ns()
        if case.batch == 1:
            got: Sequence[Read] = [driver.get(keys[0], src.outs[0])]
        else:
            got = driver.batch_get(keys, src.outs)
        dt = time.perf_counter_ns() - t0
        if len(got) != len(keys):
            raise BenchError(f"{driver.label}: asked for {len(keys)} values, got {len(got)}")
        for key, value, want in zip(keys, got, values, strict=True):
            verify(driver.label, key, value, want)
        i = (i + 1) % n_stored
        calls += 1
        keys_done += case.batch
        timed_ns += dt
        if turns is not None:
            turns.latencies_ns.append(dt)
        if time.perf_counter() >= deadline:
            break
    if turns is not None:
        turns.rates.append(keys_done / max(timed_ns, 1) * 1e9)


def _measurement(driver: Driver, case: Case, op: str, turns: _Turns) -> Measurement:
    lat = turns.latencies_ns
    rate = statistics.median(turns.rates) if turns.rates else 0.0
    return Measurement(
        system=driver.system,
        path=driver.path,
        mode=driver.mode(op),
        op=op,
        value_size=case.value_size,
        batch=case.batch,
        ops_per_s=rate,
        bytes_per_s=rate * case.value_size,
        p50_us=percentile(lat, 0.50) / 1e3,
        p99_us=percentile(lat, 0.99) / 1e3,
        rounds=len(turns.rates),
        calls=len(lat),
        api=driver.api(op, case.batch > 1),
    )


Progress = Callable[[int, int, str], None]


def run_cases(
    drivers: Sequence[Driver],
    cases: Sequence[Case],
    plan: RunPlan,
    progress: Progress | None = None,
) -> list[Measurement]:
    """Measure every driver on every case, interleaved; see the module docstring."""
    results: list[Measurement] = []
    total = len(cases) * plan.rounds * len(drivers)
    done = 0
    for case in cases:
        src = ValueSource(case)
        fills = _Fills()
        put_turns = {id(d): _Turns() for d in drivers}
        get_turns = {id(d): _Turns() for d in drivers}
        for d in drivers:
            for buf in src.buffers:
                d.register(buf)
            _calibrate(d, src, fills, plan.warmup_calls)
        for r in range(plan.rounds):
            k = r % len(drivers)
            for d in [*drivers[k:], *drivers[:k]]:
                if progress is not None:
                    progress(done, total, f"{d.label} {_case_name(case)} round {r + 1}")
                stored = _put_phase(d, src, fills, plan.seconds_per_phase, put_turns[id(d)])
                _get_phase(d, src, stored, plan.seconds_per_phase, get_turns[id(d)])
                d.reset()
                done += 1
        for d in drivers:
            for buf in src.buffers:
                d.unregister(buf)
            results.append(_measurement(d, case, "put", put_turns[id(d)]))
            results.append(_measurement(d, case, "get", get_turns[id(d)]))
    if progress is not None:
        progress(total, total, "done")
    return results


def _do_puts(driver: Driver, src: ValueSource, fill: int, n: int) -> list[int]:
    """`n` puts (or batch puts) of `fill`; the time of each call in ns."""
    times = []
    for j in range(n):
        keys, values = src.call(fill, j)
        t0 = time.perf_counter_ns()
        if src.case.batch == 1:
            driver.put(keys[0], values[0])
        else:
            driver.batch_put(keys, values)
        times.append(time.perf_counter_ns() - t0)
    return times


def _do_gets(driver: Driver, src: ValueSource, fill: int, n: int) -> list[int]:
    """`n` verified gets (or batch gets) of the first calls of `fill`; the time of each."""
    times = []
    for j in range(n):
        keys, values = src.call(fill, j)
        if n == 1:
            src.poison_outs()
        t0 = time.perf_counter_ns()
        if src.case.batch == 1:
            got: Sequence[Read] = [driver.get(keys[0], src.outs[0])]
        else:
            got = driver.batch_get(keys, src.outs)
        times.append(time.perf_counter_ns() - t0)
        for key, value, want in zip(keys, got, values, strict=True):
            verify(driver.label, key, value, want)
    return times


def _calibrate(driver: Driver, src: ValueSource, fills: _Fills, calls: int) -> None:
    """Warm a driver up on this case and choose, per op, the fastest of its `apis`.

    Untimed as far as the results go. Each API does `calls` calls, twice, the APIs taking turns
    (A B A B), so that a burst of load on the machine does not decide alone; the one with the
    lowest median call time is used for the rounds. Connections, first-use paths and page
    faults are paid here too. Every value read is verified, whichever API read it.
    """
    case = src.case
    batched = case.batch > 1
    n = max(1, min(calls, case.n_calls))
    for op in ("put", "get"):
        choices = driver.apis(op, batched)
        samples: dict[str, list[int]] = {api: [] for api in choices}
        stored = 0
        if op == "get":
            driver.reset()
            stored = fills.next()
            _do_puts(driver, src, stored, n)
        for _ in range(2 if len(choices) > 1 else 1):
            for api in choices:
                driver.use_api(op, batched, api)
                if op == "put":
                    samples[api] += _do_puts(driver, src, fills.next(), n)
                    driver.reset()
                else:
                    samples[api] += _do_gets(driver, src, stored, n)
        best = min(choices, key=lambda api: statistics.median(samples[api]))
        driver.use_api(op, batched, best)
    driver.reset()


def case_name(value_size: int, batch: int) -> str:
    """'4 KiB' for single values, '64 x 4 KiB' for batches."""
    size = size_name(value_size)
    return size if batch == 1 else f"{batch} x {size}"


def _case_name(case: Case) -> str:
    return case_name(case.value_size, case.batch)


def size_name(n: int) -> str:
    """'4 KiB', '1 MiB', '16 MiB' (no decimals for whole units, unlike `format_size`)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"
