"""`copy_bytes`: one memcpy between a caller's buffer and segment memory, steered around the
one case where glibc's memcpy is slow on AMD CPUs; `copy_and_hash`: a copy checksummed chunk
by chunk in Python (what a checksummed copy is when `kvpool.transfer.native` is not built).

glibc copies blocks from ~2 KiB (`x86_rep_movsb_threshold`) up to the L2 size (glibc's
`rep_movsb_stop_threshold` on AMD) with `rep movsb`, and `rep movsb` is many times slower when
the destination starts less than 64 bytes *after* the source modulo 4 KiB (glibc avoids that
case only on Intel CPUs). That is the distance of every read into a buffer at page + 16 (where
malloc puts large numpy arrays and bytearrays) from a page-aligned replica (where a fresh pool
puts any value whose size is a multiple of 4 KiB); docs/performance.md has the measurements.

Copies in that range at a bad distance therefore go through a per-thread bounce buffer placed
half a page away from the source: two fast copies instead of one slow one. Everything else is
the plain slice assignment (CPython's memcpy), so the common case pays one address lookup.

Distance 0 (both ends page-aligned: a registered buffer and a replica whose offset is a
multiple of 4 KiB) is slow on some of these CPUs and not on others, so it is measured once per
process (`zero_distance_slow`): 256 KiB copied at distance 0 against at half a page.
"""

from __future__ import annotations

import threading
import time
from typing import Final

import xxhash

from kvpool.transfer.registration import buffer_address

__all__ = [
    "BOUNCE_MAX",
    "SLOW_MIN",
    "copy_and_hash",
    "copy_bytes",
    "slow_distance",
    "zero_distance_slow",
]

SLOW_MIN: Final = 2048
"""Below this glibc uses vector moves whatever the distance (its threshold is 2112 bytes)."""


def _l2_bytes(default: int = 1 << 20) -> int:
    """This CPU's L2 size (glibc's cut-over from `rep movsb` to its vector loop on AMD)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size", encoding="ascii") as f:
            text = f.read().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return default


BOUNCE_MAX: Final = _l2_bytes()
"""At and above this glibc copies with its vector loop whatever the distance (512 KiB here)."""
_SHORT: Final = 64
_PAGE: Final = 4096

_local = threading.local()


_PROBE: Final = 256 << 10
"""Bytes copied by each probe of `zero_distance_slow` (in glibc's `rep movsb` range)."""
_PROBES: Final = 7
"""Probes per distance; the fastest of each is compared, so a preempted probe does not count."""
_ZERO_SLOWER: Final = 1.25
"""Distance 0 counts as slow when its fastest probe takes this much longer than at 2 KiB."""
_zero_slow: bool | None = None


def zero_distance_slow() -> bool:
    """Whether this CPU copies slowly at distance 0 (measured once per process, ~1 ms).

    A wrong answer costs speed, never bytes: either way the copies are exact."""
    global _zero_slow
    got = _zero_slow
    if got is None:
        raw = bytearray(4 * _PROBE + 2 * _PAGE)
        view = memoryview(raw)
        base = (-buffer_address(view)) % _PAGE
        src = view[base : base + _PROBE]
        src[:] = b"\x01" * _PROBE  # touched: no page fault is timed
        at_zero = view[base + 2 * _PROBE : base + 3 * _PROBE]
        at_half = view[base + 2 * _PROBE + _PAGE // 2 : base + 3 * _PROBE + _PAGE // 2]
        best = {0: 1.0, 1: 1.0}
        for _ in range(_PROBES):
            for which, dst in ((0, at_zero), (1, at_half)):
                t = time.perf_counter()
                dst[:] = src
                best[which] = min(best[which], time.perf_counter() - t)
        got = _zero_slow = best[0] > _ZERO_SLOWER * best[1]
    return got


def slow_distance(dst_addr: int, src_addr: int) -> bool:
    """Whether a `rep movsb` copy from `src_addr` to `dst_addr` takes the slow path: the
    destination 1-63 bytes past the source modulo a page, or exactly at it where this CPU is
    slow there too (`zero_distance_slow`)."""
    d = (dst_addr - src_addr) & (_PAGE - 1)
    if d:
        return d < _SHORT
    return zero_distance_slow()


def _bounce() -> tuple[memoryview, int]:
    got: tuple[memoryview, int] | None = getattr(_local, "bounce", None)
    if got is None:
        buf = bytearray(b"\x01" * (BOUNCE_MAX + _PAGE))  # written: every page touched
        view = memoryview(buf)
        got = (view, buffer_address(view))
        _local.bounce = got
    return got


def copy_bytes(dst: memoryview, src: memoryview, dst_addr: int = 0, src_addr: int = 0) -> None:
    """`dst[:] = src` (equal sizes), through the bounce buffer when that is faster.

    Pass an address already known (a mapping's base plus the offset) to spare a lookup; 0
    means "look it up"."""
    n = src.nbytes
    if n < SLOW_MIN or n >= BOUNCE_MAX:
        dst[:] = src
        return
    if not dst_addr:
        dst_addr = buffer_address(dst)
    if not src_addr:
        src_addr = buffer_address(src)
    if not slow_distance(dst_addr, src_addr):
        dst[:] = src
        return
    view, base = _bounce()
    # Half a page after the source, so both hops are at a distance of about 2 KiB.
    start = (src_addr + _PAGE // 2 - base) & (_PAGE - 1)
    hop = view[start : start + n]
    hop[:] = src
    dst[:] = hop


def copy_and_hash(read: bool, view: memoryview, mem: memoryview, offset: int, step: int) -> int:
    """Copy `view` from (`read`) or to `mem[offset:]` in chunks of `step`, hashing each chunk
    just after copying it, while it is in the cache (measured faster than hashing first);
    answers the xxh3_64 of the value. No short last chunk: it could fall back into glibc's
    slow range (`kvpool.client.sharedcopy.chunk_for`)."""
    hasher = xxhash.xxh3_64()
    n = view.nbytes
    c = 0
    while c < n:
        e = n if n - c < 2 * step else c + step
        if read:
            view[c:e] = mem[offset + c : offset + e]
        else:
            mem[offset + c : offset + e] = view[c:e]
        hasher.update(view[c:e])
        c = e
    return hasher.intdigest()
