"""What a 1 MiB copy costs by the kind of memory it lands in (docs/parts/perf-store.md, "The
memory a put lands in").

`kvpool bench compare`'s `limit/memcpy` row copies into a numpy array: private anonymous memory,
which numpy asks to back with transparent huge pages. A put through shared memory lands in a
node's memfd segment instead, and this kernel backs shared memory with 4 KiB pages only
(`/sys/kernel/mm/transparent_hugepage/shmem_enabled` is `never` here). This script copies the
same 1 MiB sources (page-aligned slices of one random buffer, as the benchmark's values are)
into fresh 1 MiB slices of: a numpy array (the limit's memory), private memory without huge
pages, private memory with them, and a memfd mapped shared (a segment), each with
`numpy.copyto`, and into the memfd as `DataPath.copy_hashing` does for a put (256 KiB chunks,
each hashed with xxh3 after its copy) and as the fused copy does it (`kvpool.transfer.native`,
when built: one pass that hashes what it stores, with the cached stores of a get and the
streamed ones of a put). The get direction too: 1 MiB out of the
numpy array (the limit's get) and out of the memfd, copied then hashed, or fused. Rounds
interleave the kinds; prints the median of the rounds' medians, in µs. Asserts nothing.

    .venv/bin/python benchmarks/copy_targets.py [--rounds 15] [--calls 60]
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import xxhash

from kvpool.transfer.native import copy_path, copy_xxh3

SIZE = 1 << 20
SPAN = 512 << 20
CHUNK = 256 << 10
Array = npt.NDArray[np.uint8]


def _mapped(flags: int, advice: int | None, fd: int = -1) -> tuple[mmap.mmap, Array]:
    m = mmap.mmap(fd, SPAN, flags=flags)
    if advice is not None:
        m.madvise(advice)
    a = np.frombuffer(m, dtype=np.uint8)
    a[:] = 1  # every page touched: no first-touch fault is timed
    return m, a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args()
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    fd = os.memfd_create("kvpool-copy-targets")
    try:
        os.ftruncate(fd, SPAN)
        maps = {
            "numpy array (the limit row)": (None, np.ones(SPAN, dtype=np.uint8)),
            "private, 4 KiB pages": _mapped(private, mmap.MADV_NOHUGEPAGE),
            "private, huge pages": _mapped(private, mmap.MADV_HUGEPAGE),
            "memfd, shared (a segment)": _mapped(mmap.MAP_SHARED | mmap.MAP_POPULATE, None, fd),
        }
        base = np.frombuffer(os.urandom(8 << 20), dtype=np.uint8)

        def source(j: int) -> Array:
            o = (j * 4096 * 37) % (len(base) - SIZE)
            return base[o : o + SIZE]

        def copy(dst: Array) -> Callable[[int], None]:
            def run(j: int) -> None:
                o = (j * SIZE) % SPAN
                np.copyto(dst[o : o + SIZE], source(j))

            return run

        def copy_hashing(dst: Array) -> Callable[[int], None]:
            view = memoryview(dst)

            def run(j: int) -> None:
                o = (j * SIZE) % SPAN
                src = memoryview(source(j))
                h = xxhash.xxh3_64()
                for c in range(0, SIZE, CHUNK):
                    view[o + c : o + c + CHUNK] = src[c : c + CHUNK]
                    h.update(src[c : c + CHUNK])
                h.intdigest()

            return run

        out = np.ones(SIZE, dtype=np.uint8)
        out_at = out.ctypes.data

        def fused_in(dst: Array, stream: int) -> Callable[[int], None]:
            at = dst.ctypes.data

            def run(j: int) -> None:
                assert copy_xxh3 is not None
                copy_xxh3(at + (j * SIZE) % SPAN, source(j).ctypes.data, SIZE, stream)

            return run

        def copy_out(src: Array, hashed: bool) -> Callable[[int], None]:
            def run(j: int) -> None:
                o = (j * SIZE * 7) % SPAN  # spread over the span: from memory, not the cache
                np.copyto(out, src[o : o + SIZE])
                if hashed:
                    xxhash.xxh3_64_intdigest(out)

            return run

        def fused_out(src: Array) -> Callable[[int], None]:
            at = src.ctypes.data

            def run(j: int) -> None:
                assert copy_xxh3 is not None
                copy_xxh3(out_at, at + (j * SIZE * 7) % SPAN, SIZE, 0)

            return run

        cases = {f"copy into {name}": copy(a) for name, (_, a) in maps.items()}
        shm = maps["memfd, shared (a segment)"][1]
        limit = maps["numpy array (the limit row)"][1]
        cases["copy_hashing into the memfd (a put)"] = copy_hashing(shm)
        if copy_xxh3 is not None:
            cases[f"fused copy into the memfd ({copy_path}, cached stores)"] = fused_in(shm, 0)
            cases[f"fused copy into the memfd (a put; {copy_path}, streamed)"] = fused_in(shm, 1)
        cases["copy out of the numpy array (the limit's get)"] = copy_out(limit, False)
        cases["copy out of the memfd, then xxh3 (a get)"] = copy_out(shm, True)
        if copy_xxh3 is not None:
            cases[f"fused copy out of the memfd (a get; {copy_path})"] = fused_out(shm)
        medians: dict[str, list[float]] = {name: [] for name in cases}
        j = 0
        for _ in range(args.rounds):
            for name, run in cases.items():
                times = []
                for _ in range(args.calls):
                    t = time.perf_counter()
                    run(j)
                    times.append(time.perf_counter() - t)
                    j += 1
                medians[name].append(statistics.median(times) * 1e6)
        first = statistics.median(next(iter(medians.values())))
        print(f"1 MiB copies, {args.rounds} rounds x {args.calls}; load {os.getloadavg()[0]:.1f}")
        print("| copy | µs (median) | ÷ numpy array |")
        print("|---|---:|---:|")
        for name, ms in medians.items():
            m = statistics.median(ms)
            print(f"| {name} | {m:.1f} | {m / first:.2f} |")
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
