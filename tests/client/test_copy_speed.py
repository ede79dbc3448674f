"""The speed-motivated choices of the same-host copy paths keep every byte exact and every
read verified (issue 18, "Speed round 2").

Speed itself is measured by benchmarks (`benchmarks/fast_paths.py`, `kvpool bench compare`),
never asserted here; these tests pin what the faster paths must still do: copy exactly, hash
what they return, and refuse bytes that do not match the recorded checksum.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import xxhash

from kvpool.client import Store
from kvpool.client import datapath as datapath_mod
from kvpool.client import reader as reader_mod
from kvpool.client.datapath import DataPath
from kvpool.client.sharedcopy import HASH_CHUNK, LONG_CHUNK, chunk_for
from kvpool.errors import ChecksumMismatch, ErrorCode
from kvpool.transfer import copy as copy_mod
from kvpool.transfer import native
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401

MiB = 1 << 20


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="32MiB")


@pytest.fixture(params=[True, False], ids=["zero-slow", "zero-fast"])
def zero_slow(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both answers of the distance-0 probe, whatever this CPU measured."""
    slow: bool = request.param
    monkeypatch.setattr(copy_mod, "_zero_slow", slow)
    return slow


@pytest.fixture(params=["native", "python"])
def copy_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a checksummed copy is made: the fused native pass (`kvpool.transfer.native`,
    when built) and the Python copy-then-hash it falls back to."""
    way: str = request.param
    if way == "python":
        monkeypatch.setattr(datapath_mod, "copy_xxh3", None)
        monkeypatch.setattr(reader_mod, "copy_xxh3", None)
    elif native.copy_xxh3 is None:
        if os.environ.get("KVPOOL_REQUIRE_NATIVE") == "1":
            pytest.fail(f"the fused copy is required here but is {native.copy_path}")
        pytest.skip(f"the fused copy is {native.copy_path}")
    return way


@pytest.fixture
def cached(one_node: Pool, copy_way: str) -> Iterator[Store]:
    del copy_way  # (set up first)
    with Store(one_node.address, read_mode="cached", write_mode="nowait") as s:
        try:
            yield s
        finally:
            s.flush()
            s.remove_all(force=True)


def _page_aligned(n: int) -> np.ndarray:
    raw = np.zeros(n + 4096, np.uint8)
    start = (-raw.ctypes.data) % 4096
    return raw[start : start + n]


def test_page_aligned_copies_use_the_hash_chunk_where_distance_zero_is_fast(
    zero_slow: bool,
) -> None:
    page = 1 << 30
    want = LONG_CHUNK if zero_slow else HASH_CHUNK
    assert chunk_for(page, page) == want
    assert chunk_for(page + 8 * 4096, page) == want
    assert chunk_for(page + 16, page) == LONG_CHUNK  # 1-63 bytes past: always the long chunk


@pytest.mark.parametrize("size", [MiB, MiB + 4096, 3 * MiB])
def test_page_aligned_fast_put_and_get_into_are_byte_exact(
    zero_slow: bool, cached: Store, size: int
) -> None:
    src = _page_aligned(size)
    src[:] = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    dst = _page_aligned(size)
    cached.register_buffer(src)
    cached.register_buffer(dst)
    try:
        key = f"aligned-{size}-{zero_slow}"
        assert cached.put_from(key, src) is True
        cached.flush()  # the commit's answer: stored
        assert cached.get_into(key, memoryview(dst)) == size
        assert np.array_equal(src, dst)
        assert cached.get(key) == src.tobytes()
    finally:
        cached.unregister_buffer(src)
        cached.unregister_buffer(dst)


def test_bytes_changed_under_a_remembered_place_are_never_returned(
    zero_slow: bool, one_node: Pool, cached: Store
) -> None:
    """A torn read at 1 MiB on the chunked path: the bytes at the remembered place change
    (as when the range is freed and reused) after the value was read once. Neither the cached
    read nor the strict read it falls back to may return them: the checksum refuses them."""
    size = MiB
    value = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8).tobytes()
    key = f"torn-{zero_slow}"
    assert cached.put(key, value) is True
    cached.flush()
    dst = _page_aligned(size)
    cached.register_buffer(dst)
    try:
        _tear(cached, key, value, dst)
    finally:
        cached.unregister_buffer(dst)


def _tear(cached: Store, key: str, value: bytes, dst: np.ndarray) -> None:
    size = len(value)
    assert cached.get_into(key, memoryview(dst)) == size  # remembered
    assert dst.tobytes() == value
    (desc,) = cached.get_replica_desc(key)
    data = cached._data
    assert data is not None
    hold = data.hold_mapped(str(desc.segment))
    assert hold is not None
    with hold:
        at = desc.offset + size // 2 + 123  # in the middle of a chunk
        hold.buffer[at] ^= 0xFF
    dst[:] = 0
    with pytest.raises(ChecksumMismatch):
        cached.get_into(key, memoryview(dst))
    with pytest.raises(ChecksumMismatch):
        cached.get(key)
    assert xxhash.xxh3_64_intdigest(value) != xxhash.xxh3_64_intdigest(dst)


@pytest.mark.parametrize("size", [MiB, 3 * MiB + 5])
def test_a_cached_get_below_the_shared_size_copies_in_one_go_and_checks_the_whole_value(
    cached: Store, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`get` of a remembered value below SHARED_MIN on a mapped segment is one copy into the
    new bytearray (no zero-filled buffer, no chunked copy), hashed as it is copied (native) or
    just after; a changed byte anywhere in it is still refused."""
    value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    key = f"direct-{size}"
    assert cached.put(key, value) is True
    cached.flush()
    chunked: list[int] = []
    real = DataPath.copy_hashing

    def spy(self: DataPath, *args: Any) -> Any:
        chunked.append(1)
        return real(self, *args)

    monkeypatch.setattr(DataPath, "copy_hashing", spy)
    assert cached.get(key) == value
    assert chunked == []  # the remembered place, copied in one go
    (desc,) = cached.get_replica_desc(key)
    data = cached._data
    assert data is not None
    hold = data.hold_mapped(str(desc.segment))
    assert hold is not None
    with hold:
        hold.buffer[desc.offset + size - 1] ^= 0x01  # the very last byte
    with pytest.raises(ChecksumMismatch):
        cached.get(key)


@pytest.mark.parametrize("mode", ["strict", "cached"])
def test_batches_of_large_values_are_byte_exact_and_checked(
    one_node: Pool, copy_way: str, mode: str
) -> None:
    """Values from FUSED_MIN up in a batch take the fused copy (native) or copy-then-hash
    (python), strict and cached alike: every byte comes back, and a value whose bytes changed
    in place is refused by its checksum (CHECKSUM_MISMATCH) while the others still read."""
    del copy_way
    modes = {"read_mode": "cached", "write_mode": "nowait"} if mode == "cached" else {}
    sizes = [datapath_mod.FUSED_MIN, datapath_mod.FUSED_MIN + 4097, MiB, 5000]
    rng = np.random.default_rng(len(sizes))
    with Store(one_node.address, **modes) as s:  # type: ignore[arg-type]
        src = [_page_aligned(n) for n in sizes]
        dst = [_page_aligned(n) for n in sizes]
        for a in src:
            a[:] = rng.integers(0, 256, a.size, dtype=np.uint8)
        for a in (*src, *dst):
            s.register_buffer(a)
        keys = [f"batch-{mode}-{i}" for i in range(len(sizes))]
        try:
            assert s.batch_put_from(keys, src) == [ErrorCode.OK] * len(keys)
            s.flush()
            assert s.batch_get_into(keys, dst) == sizes
            assert all(np.array_equal(a, b) for a, b in zip(src, dst, strict=True))
            got = s.batch_get(keys)
            assert [bytes(g or b"") for g in got] == [a.tobytes() for a in src]
            (desc,) = s.get_replica_desc(keys[1])
            data = s._data
            assert data is not None
            hold = data.hold_mapped(str(desc.segment))
            assert hold is not None
            with hold:
                hold.buffer[desc.offset + sizes[1] // 3] ^= 0x40
            for a in dst:
                a[:] = 0
            codes = s.batch_get_into(keys, dst)
            assert codes[1] == ErrorCode.CHECKSUM_MISMATCH  # (negative already)
            assert [codes[i] for i in (0, 2, 3)] == [sizes[i] for i in (0, 2, 3)]
            assert all(np.array_equal(src[i], dst[i]) for i in (0, 2, 3))
        finally:
            s.flush()
            s.remove_all(force=True)
            for a in (*src, *dst):
                s.unregister_buffer(a)
