"""Fused copy-and-checksum: copy a value and compute its xxh3_64 in one pass (copyhash.c).

Every value kvpool copies on one host is checksummed (xxh3_64) as it is copied: a put records
the checksum, a get verifies that what it copied is what was put. In Python that is a copy and
then a hash of the copy: the hash runs at cache speed but after the copy, a quarter of a
memcpy's time on top of it for a 1 MiB value. copyhash.c hashes each 64-byte stripe from the
registers it has just loaded and stored, so the hash runs while the copy waits on memory and a
checksummed copy costs about what the copy alone costs (docs/parts/perf-store.md, "A copy
that checksums as it goes").

`copy_xxh3(dst, src, n, stream)` copies `n` bytes between two addresses (n >= MIN_BYTES; the
regions must not overlap) and answers the xxh3_64 of the bytes now at `dst` (bit for bit the digest
python-xxhash gives; each is checked against it when the library is loaded). The GIL is
released while it runs (ctypes does that for every foreign call). `stream=1` writes `dst` with
non-temporal stores (around the cache), for a put: its bytes are not read again by this
process, and skipping the read of every destination line before it is overwritten makes the
copy faster than a memcpy; a get (`stream=0`) leaves the value in the cache for its caller.

The library is `_copyhash.so` beside this file, built with the system C compiler by `make`, by
`pip install` (the build hook) or by `python -m kvpool.transfer.native.build`. When it is not
built, is of another version, fails its self-check, or KVPOOL_NATIVE=0 is set, `copy_xxh3` is
None and the callers copy and hash in Python as before: slower, never wrong.

`new_bytearray(n)` answers a bytearray of `n` bytes that are not zero-filled first (for a
`get` whose result is about to be overwritten by a copy); `read_new(address, n)` copies `n`
bytes at an address into a new one and answers it with their xxh3_64.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

__all__ = ["LIBRARY", "MIN_BYTES", "copy_path", "copy_xxh3", "new_bytearray", "read_new"]

log = logging.getLogger(__name__)

MIN_BYTES: Final = 256
"""The smallest copy `copy_xxh3` takes (shorter inputs take other paths of xxh3)."""
_VERSION: Final = 3
"""The interface version this loader expects (`kv_copyhash_version` in copyhash.c)."""
_PATHS: Final = {1: "scalar", 2: "avx2"}
LIBRARY: Final = Path(__file__).with_name("_copyhash.so")
"""Where `build` puts the library (`build.LIBRARY`, the same path: not imported from there, so
that `python -m kvpool.transfer.native.build` is not a module its package already ran)."""


def _self_check(fn: Callable[[int, int, int, int], int]) -> bool:
    """Copy-and-hash a few lengths of a fixed pattern and compare with python-xxhash."""
    import xxhash

    src = bytearray(os.urandom(70_000))  # (also: no pattern a wrong digest could share)
    dst = bytearray(len(src))
    s = ctypes.addressof(ctypes.c_char.from_buffer(src))
    d = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    for n in (MIN_BYTES, 1000, 1024, 1025, 4096, 65_537, len(src)):
        for stream in (0, 1):
            dst[:n] = bytes(n)
            want = xxhash.xxh3_64_intdigest(memoryview(src)[:n])
            if fn(d, s, n, stream) != want or dst[:n] != src[:n]:
                return False
    return True


_Copy = Callable[[int, int, int, int], int]


def _load(library: Path = LIBRARY) -> tuple[_Copy | None, str, Callable[[int], int] | None]:
    """(copy_xxh3, which path it takes or why it is not there, the library's path switch)."""
    if os.environ.get("KVPOOL_NATIVE", "1") == "0":
        return None, "off (KVPOOL_NATIVE=0)", None
    if not library.exists():
        return None, "off (not built: python -m kvpool.transfer.native.build)", None
    try:
        lib = ctypes.CDLL(str(library))
        if lib.kv_copyhash_version() != _VERSION:
            return None, f"off ({library.name} is of another version: rebuild it)", None
        fn = lib.kv_copy_xxh3
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_uint64
        use = lib.kv_copyhash_use
        use.argtypes = [ctypes.c_int]
        use.restype = ctypes.c_int
    except (OSError, AttributeError) as exc:
        return None, f"off ({library.name} did not load: {exc})", None
    # Both paths are checked: the scalar one (which CPUs without AVX2 take) and the best.
    if not (use(1) and _self_check(fn) and use(0) and _self_check(fn)):
        log.warning("%s fails its self-check; copies are checksummed in Python", library)
        return None, "off (failed its self-check)", None
    return fn, _PATHS.get(use(0), "scalar"), use


_loaded = _load()
copy_xxh3: Final = _loaded[0]
copy_path: Final = _loaded[1]
"""Which path `copy_xxh3` takes ("avx2", "scalar"), or "off (why it is not there)"."""
_use_path: Final = _loaded[2]
"""`kv_copyhash_use`: 1 forces the scalar path, 0 the best (for the tests), or None."""

_from_size = ctypes.pythonapi.PyByteArray_FromStringAndSize
_from_size.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_from_size.restype = ctypes.py_object


def new_bytearray(n: int) -> bytearray:
    """A bytearray of `n` bytes whose contents are whatever the allocator gave (not zeroed)."""
    out: bytearray = _from_size(None, n)
    return out


def read_new(src: int, n: int) -> tuple[bytearray, int]:
    """A new bytearray of the `n` bytes at address `src` and their xxh3_64, in one pass (no
    zero-filling first). Only when `copy_xxh3` is there and n >= MIN_BYTES."""
    assert copy_xxh3 is not None and n >= MIN_BYTES
    out = new_bytearray(n)
    return out, copy_xxh3(ctypes.addressof(ctypes.c_char.from_buffer(out)), src, n, 0)
