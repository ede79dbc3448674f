"""Values a test can tell apart: object `i`'s bytes, its number and a tag repeated.

A test reads a value back and compares it with `pattern(i, TAG, size)` made again: a replica of
another object, another write (another tag) or a torn copy shows as a mismatch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MiB", "pattern", "random_values"]

MiB = 1 << 20


def pattern(i: int, tag: bytes, size: int = MiB) -> bytes:
    """`size // 16` times `i` (8 bytes, little-endian) and the 8-byte `tag`."""
    assert len(tag) == 8, tag
    return (i.to_bytes(8, "little") + tag) * (size // 16)


def random_values(prefix: str, n: int, seed: int, base: int, step: int) -> dict[str, bytes]:
    """`n` values of random bytes from `seed`: key f"{prefix}-{i}" gets `base + step * i` bytes
    (each size different, so a value read from another key's place shows)."""
    rng = np.random.default_rng(seed)
    return {
        f"{prefix}-{i}": rng.integers(0, 256, base + step * i, dtype=np.uint8).tobytes()
        for i in range(n)
    }
