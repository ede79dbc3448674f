"""The collector's cost in the master: lock-step PutCommit with the master's gen-0 threshold
(10,000, set by `MasterServer.start`) against Python's default (700), what decided the setting
(docs/parts/perf-master.md, "The collector").

    .venv/bin/python benchmarks/master_gc_tail.py [--n 30000] [--rounds 3] [--gen0 700,master]
        [--batch 64]

Each round starts one `kvpool master` child per setting (alternating, default first), reserves
arenas before the clock starts, and sends `--n` lock-step PutCommits of fresh 4 KiB keys from
this process, timing each round trip (`--batch 64`: BatchPutCommits of 64 keys, the fastest
way to make new records; CPU per key). A `sitecustomize` module on the child's PYTHONPATH (a
temporary directory) times every collection in the master (`gc.callbacks`) and, for the default
setting given as a number (`--gen0 700`: Python's default), sets that threshold and turns the
master's own `gc.set_threshold` call into a no-op (`master`: the master's setting), so the
code is the same in all. Prints per round and setting the round trip's p50/p99/p99.9/max, the master's CPU per
commit (user + system from /proc), and the collections inside the measured window: how many per
1,000 commits and their pause p50/p99/max (microseconds); then medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kvpool.bench.master import OBJECT_SIZE, WRITER, _keys, _Master
from kvpool.bench.rows import percentile
from kvpool.protocol import messages as m

_SITE = """\
import atexit, gc, json, os, time
_gen0 = os.environ.get("KVPOOL_BENCH_GC0")
if _gen0:  # this threshold, and the master's own gc.set_threshold call a no-op
    gc.set_threshold(int(_gen0), *gc.get_threshold()[1:])
    gc.set_threshold = lambda *a: None
_log = os.environ.get("KVPOOL_BENCH_GC_LOG")
if _log:
    _pauses = []
    _t = [0.0]
    def _cb(phase, info):
        if phase == "start":
            _t[0] = time.perf_counter()
        else:
            _pauses.append((info["generation"], time.perf_counter() - _t[0], time.monotonic()))
    gc.callbacks.append(_cb)
    def _dump():
        with open(_log, "w") as f:
            json.dump({"threshold": gc.get_threshold(), "pauses": _pauses}, f)
    atexit.register(_dump)
"""
_ARENA = 64 << 20


def _round(
    n: int, batch: int, tag: str, log: Path
) -> tuple[list[float], float, list[tuple[int, float]], float, float]:
    """Round trips (s) of `n` lock-step PutCommits on a fresh master, its CPU s per commit, the
    pauses (s) of its collections inside the window, the window (monotonic s)."""
    master = _Master(reclaim=True)
    try:
        rpc = master.rpc
        per_arena = _ARENA // OBJECT_SIZE
        arenas: list[m.ArenaReply] = []
        for _ in range((n + per_arena - 1) // per_arena):
            a = rpc.call(m.ReserveArena(WRITER, _ARENA, _ARENA))
            assert isinstance(a, m.ArenaReply) and a.code == 0, a
            arenas.append(a)
        keys = _keys(f"gc{tag}", n)
        place = [
            (
                arenas[i // per_arena].arena_id,
                arenas[i // per_arena].offset + (i % per_arena) * OBJECT_SIZE,
            )
            for i in range(n)
        ]
        reqs: list[Any]
        if batch == 1:
            reqs = [
                m.PutCommit(WRITER, k, OBJECT_SIZE, place[i][0], place[i][1], i)
                for i, k in enumerate(keys)
            ]
        else:  # (an arena holds a multiple of `batch` values: no batch spans two)
            reqs = [
                m.BatchPutCommit(
                    WRITER,
                    place[i][0],
                    keys[i : i + batch],
                    [OBJECT_SIZE] * len(keys[i : i + batch]),
                    [p for _, p in place[i : i + batch]],
                    list(range(i, i + len(keys[i : i + batch]))),
                )
                for i in range(0, n, batch)
            ]
        call, clock = rpc.call, time.perf_counter
        lat: list[float] = []
        cpu0 = master.cpu_s()
        w0 = time.monotonic()
        for req in reqs:
            t = clock()
            reply = call(req)
            lat.append(clock() - t)
            assert set(getattr(reply, "codes", None) or [reply.code]) == {0}, reply
        w1 = time.monotonic()
        cpu = (master.cpu_s() - cpu0) / n
    finally:
        master.close()
    got = json.loads(log.read_text())
    pauses = [(gen, p) for gen, p, at in got["pauses"] if w0 <= at <= w1]
    return lat, cpu, pauses, w0, w1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30_000, help="lock-step PutCommits per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1, help="keys per commit (BatchPutCommit)")
    ap.add_argument("--gen0", default="700,master", help="thresholds to compare, in turn")
    args = ap.parse_args()
    settings = [
        ("master's setting" if g == "master" else f"gen0={g}", "" if g == "master" else g)
        for g in args.gen0.split(",")
    ]
    cols = ["p50", "p99", "p99.9", "max", "CPU/commit", "GCs/1k", "GC p50", "GC p99", "GC max"]
    cols += ["gen1 max", "gen2 max"]
    rows: dict[str, list[list[float]]] = {s: [] for s, _ in settings}
    with tempfile.TemporaryDirectory() as site:
        Path(site, "sitecustomize.py").write_text(_SITE)
        saved = {k: os.environ.get(k) for k in _ENV}
        old_path = saved["PYTHONPATH"]
        os.environ["PYTHONPATH"] = site + (os.pathsep + old_path if old_path else "")
        try:
            for rnd in range(args.rounds):
                for name, default in settings:
                    log = Path(site, f"gc-{rnd}-{default or 'master'}.json")
                    os.environ["KVPOOL_BENCH_GC0"] = default
                    os.environ["KVPOOL_BENCH_GC_LOG"] = str(log)
                    lat, cpu, pauses, _, _ = _round(args.n, args.batch, f"{rnd}{default}", log)
                    every = [p for _, p in pauses] or [0.0]
                    by_gen = [
                        max((p for g, p in pauses if g == gen), default=0.0) for gen in (1, 2)
                    ]
                    row = [
                        percentile(lat, 0.5) * 1e6,
                        percentile(lat, 0.99) * 1e6,
                        percentile(lat, 0.999) * 1e6,
                        max(lat) * 1e6,
                        cpu * 1e6,
                        len(pauses) * 1000 / args.n,
                        percentile(every, 0.5) * 1e6,
                        percentile(every, 0.99) * 1e6,
                        max(every) * 1e6,
                        by_gen[0] * 1e6,
                        by_gen[1] * 1e6,
                    ]
                    rows[name].append(row)
                    print(
                        f"round {rnd} {name}: "
                        + ", ".join(f"{c} {v:.1f}" for c, v in zip(cols, row, strict=True)),
                        flush=True,
                    )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    print("| gen-0 threshold | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, got in rows.items():
        med = [statistics.median(r[i] for r in got) for i in range(len(cols))]
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in med) + " |")


_ENV = ("PYTHONPATH", "KVPOOL_BENCH_GC0", "KVPOOL_BENCH_GC_LOG")

if __name__ == "__main__":
    main()
