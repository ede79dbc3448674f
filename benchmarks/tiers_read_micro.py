"""The pieces of a disk-tier read, measured alone (docs/parts/perf-tiers.md quotes them).

    .venv/bin/python benchmarks/tiers_read_micro.py [--dir DIR] [--file-mib 256] [--rounds 6]
                                                    [--only local|tcp]

`local`: reading 1 MiB and 16 MiB of a tier-like file that is in the page cache, each
followed by its xxh3_64 as a get checks it, three ways: a copy from a fresh (unpopulated)
mapping of the file (`map`), the same after `MADV_POPULATE_READ` of the range (`populate`),
and `preadv` into the destination (`preadv`, what `kvpool.client.disk_files` does).

`tcp`: a `TransferServer` in this process serves a disk tier's data file (mapped as
`kvpool.client.disk` mounts it) and a memfd segment of the same size; a TCP `TransferEngine`
(one stream) reads 1 MiB and 16 MiB from each: the tier with `sendfile` from its file
(`SendfilePolicy.ALWAYS`), the tier with `sendmsg` from the mapping (`NEVER`), and the memfd
segment (`sendmsg` from its mapping). Each case reads ranges no earlier case read, so the
server's mapping pays its first-touch faults as a large tier does.

Cases alternate in every round so that a shared machine's drift shows in all of them alike.
Prints medians (µs) and GB/s; asserts nothing but the bytes read.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import xxhash

from kvpool.transfer import (
    SegmentLocation,
    SegmentMemory,
    TransferEngine,
    TransferOp,
    TransferRequest,
    TransferServer,
)
from kvpool.transfer.memory import DISK_FILE_NAME
from kvpool.transfer.serving import SendfilePolicy

MiB = 1 << 20
SIZES = (MiB, 16 * MiB)
_MADV_POPULATE_READ = 22


def _make_file(directory: str, nbytes: int) -> str:
    path = os.path.join(directory, DISK_FILE_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        block = os.urandom(16 * MiB)
        for off in range(0, nbytes, len(block)):
            os.pwrite(fd, block[: min(len(block), nbytes - off)], off)
    finally:
        os.close(fd)
    return path


def _report(title: str, times: dict[tuple[str, int], list[float]]) -> None:
    print(title)
    print(f"{'case':<12}{'size':>8}{'p50 us':>10}{'GB/s':>8}")
    for (case, size), ts in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        p50 = statistics.median(ts)
        print(f"{case:<12}{size // MiB:>6}Mi{p50 * 1e6:>10.0f}{size / p50 / 1e9:>8.2f}")


def local(path: str, nbytes: int, rounds: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    times: dict[tuple[str, int], list[float]] = {}

    def by_map(m: mmap.mmap, mv: memoryview, off: int, dest: bytearray) -> None:
        dest[:] = mv[off : off + len(dest)]

    def by_populate(m: mmap.mmap, mv: memoryview, off: int, dest: bytearray) -> None:
        m.madvise(_MADV_POPULATE_READ, off, len(dest))
        dest[:] = mv[off : off + len(dest)]

    def by_preadv(m: mmap.mmap, mv: memoryview, off: int, dest: bytearray) -> None:
        os.preadv(fd, [dest], off)

    ways: dict[str, Callable[[mmap.mmap, memoryview, int, bytearray], None]] = {
        "map": by_map,
        "populate": by_populate,
        "preadv": by_preadv,
    }
    try:
        for r in range(rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for way in order:
                m = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)  # fresh: cold PTEs
                mv = memoryview(m)
                try:
                    for size in SIZES:
                        dest = bytearray(size)
                        for off in range(0, min(nbytes - size + 1, 8 * size), size):
                            t = time.perf_counter()
                            ways[way](m, mv, off, dest)
                            xxhash.xxh3_64_intdigest(dest)
                            times.setdefault((way, size), []).append(time.perf_counter() - t)
                finally:
                    mv.release()
                    m.close()
    finally:
        os.close(fd)
    _report("local: copy and xxh3 of a tier-like file in the page cache", times)


def tcp(path: str, nbytes: int, rounds: int) -> None:
    tier = SegmentMemory.map_file("tier", path, nbytes, populate=False, share=True)
    memfd = SegmentMemory.create("memfd", nbytes)
    memfd.buffer[:] = tier.buffer
    server = TransferServer()
    engine: TransferEngine | None = None
    times: dict[tuple[str, int], list[float]] = {}
    cases = {"sendfile": "tier", "tier-mmap": "tier", "memfd": "memfd"}
    try:
        server.add_segment(tier)
        server.add_segment(memfd)
        locs = {
            n: SegmentLocation(n, nbytes, "another-host", server.endpoint, "")
            for n in ("tier", "memfd")
        }
        engine = TransferEngine(lambda n: locs[n], "tcp", tcp_streams=1)
        offset = 0
        for r in range(rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for case in order:
                server.sendfile = (
                    SendfilePolicy.ALWAYS if case == "sendfile" else SendfilePolicy.NEVER
                )
                for size in SIZES:
                    out = bytearray(size)
                    for _ in range(2):
                        if offset + size > nbytes:
                            offset = 0  # wrapped: later reads find the pages mapped
                        req = TransferRequest(TransferOp.READ, out, cases[case], offset)
                        t = time.perf_counter()
                        code = engine.transfer_batch([req])[0]
                        times.setdefault((case, size), []).append(time.perf_counter() - t)
                        if code != 0 or out[:4096] != tier.buffer[offset : offset + 4096]:
                            raise SystemExit(f"{case}: read at {offset} failed ({code})")
                        offset += size
        print(f"sendfile READs served: {server.counters().sendfile_reads}")
    finally:
        if engine is not None:
            engine.close()
        server.close()
        memfd.close()
        tier.close()
    _report("tcp: one READ over loopback, one stream", times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None, help="where the tier-like file goes (temp dir)")
    p.add_argument("--file-mib", type=int, default=256, help="size of the file, MiB")
    p.add_argument("--rounds", type=int, default=6, help="rounds of every case")
    p.add_argument("--only", choices=("local", "tcp"), default=None, help="one part only")
    args = p.parse_args()
    nbytes = args.file_mib * MiB
    with tempfile.TemporaryDirectory(prefix="kvpool-tiers-micro-", dir=args.dir) as d:
        path = _make_file(d, nbytes)
        if args.only in (None, "local"):
            local(path, nbytes, args.rounds)
        if args.only in (None, "tcp"):
            tcp(path, nbytes, args.rounds)


if __name__ == "__main__":
    main()
