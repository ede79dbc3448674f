"""`copy_bytes`: byte-exact at every size and alignment, and the bounce only where it pays.

Speed is not asserted (shared machine); the choice of path and the bytes are.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.transfer import copy as copy_mod
from kvpool.transfer.copy import (
    BOUNCE_MAX,
    SLOW_MIN,
    copy_bytes,
    slow_distance,
    zero_distance_slow,
)
from kvpool.transfer.registration import buffer_address


def at(past_page: int, n: int) -> memoryview:
    raw = np.zeros(n + 3 * 4096, np.uint8)
    start = (-raw.ctypes.data) % 4096 + past_page
    return memoryview(raw[start : start + n])


def test_slow_distance_is_a_destination_just_after_the_source_mod_a_page() -> None:
    assert slow_distance(4096 + 16, 0)
    assert slow_distance(8192 * 5, 8192) is copy_mod.zero_distance_slow()  # distance 0
    assert slow_distance(63, 0)
    assert not slow_distance(64, 0)
    assert not slow_distance(0, 16)  # destination before the source: fine
    assert not slow_distance(2048, 0)


@pytest.mark.parametrize("slow", [True, False])
def test_distance_zero_is_slow_only_where_this_cpu_measured_it_so(
    monkeypatch: pytest.MonkeyPatch, slow: bool
) -> None:
    monkeypatch.setattr(copy_mod, "_zero_slow", slow)
    assert slow_distance(8192 * 5, 8192) is slow
    assert slow_distance(4096, 0) is slow
    assert slow_distance(4096 + 16, 0)  # 1-63 bytes past: slow on every such CPU
    assert not slow_distance(4096 + 64, 0)


def test_the_distance_zero_probe_runs_once_and_answers_a_bool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(copy_mod, "_zero_slow", None)
    first = zero_distance_slow()
    assert isinstance(first, bool)
    assert copy_mod._zero_slow is first
    assert zero_distance_slow() is first


@pytest.mark.parametrize("slow", [True, False])
def test_copy_at_distance_zero_is_byte_exact_either_way(
    monkeypatch: pytest.MonkeyPatch, slow: bool
) -> None:
    monkeypatch.setattr(copy_mod, "_zero_slow", slow)
    n = 256 << 10
    src = at(0, n)
    src[:] = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8).tobytes()
    dst = at(0, n)
    copy_bytes(dst, src)
    assert dst == src


@pytest.mark.parametrize(
    "n", [1, SLOW_MIN - 1, SLOW_MIN, 4096, 65536 + 5, BOUNCE_MAX - 1, BOUNCE_MAX]
)
@pytest.mark.parametrize(("dst_off", "src_off"), [(16, 0), (0, 0), (48, 4080), (2048, 0), (0, 16)])
def test_copy_is_byte_exact_at_every_alignment(n: int, dst_off: int, src_off: int) -> None:
    src = at(src_off, n)
    src[:] = np.random.default_rng(n + dst_off).integers(0, 256, n, dtype=np.uint8).tobytes()
    dst = at(dst_off, n)
    copy_bytes(dst, src)
    assert dst == src
    dst2 = at(dst_off, n)
    copy_bytes(dst2, src, buffer_address(dst2), buffer_address(src))  # addresses given
    assert dst2 == src


def test_only_slow_distances_in_the_rep_movsb_range_use_the_bounce_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    used: list[int] = []
    real = copy_mod._bounce

    def spy() -> tuple[memoryview, int]:
        used.append(1)
        return real()

    monkeypatch.setattr(copy_mod, "_bounce", spy)
    n = 256 << 10
    copy_bytes(at(16, n), at(0, n))
    assert used == [1]
    copy_bytes(at(2048, n), at(0, n))  # a good distance: direct
    copy_bytes(at(16, BOUNCE_MAX), at(0, BOUNCE_MAX))  # glibc's vector loop: direct
    copy_bytes(at(16, 1024), at(0, 1024))  # vector moves: direct
    assert used == [1]
