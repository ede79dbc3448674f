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
each hashed with xxh3 after its copy). Rounds interleave the kinds; prints the median of the
rounds' medians, in µs. Asserts nothing.

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

        cases = {f"copy into {name}": copy(a) for name, (_, a) in maps.items()}
        shm = maps["memfd, shared (a segment)"][1]
        cases["copy_hashing into the memfd (a put)"] = copy_hashing(shm)
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
