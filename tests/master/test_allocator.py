"""The segment offset allocator: aligned, never overlapping, fully coalescing, and it finds a
fitting block whenever one exists (property tests with hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.master.allocator import OffsetAllocator


def _check_invariants(alloc: OffsetAllocator, live: dict[int, int]) -> None:
    """Live blocks and free blocks tile [0, capacity) exactly, and free blocks never touch."""
    spans = [(off, alloc.aligned(size), "live") for off, size in live.items()]
    spans += [(off, size, "free") for off, size in alloc.free_blocks()]
    spans.sort()
    pos = 0
    prev_kind = ""
    for off, size, kind in spans:
        assert off == pos, f"gap or overlap at {pos}: next span starts at {off}"
        assert off % alloc.alignment == 0 and size % alloc.alignment == 0 and size > 0
        assert not (kind == "free" and prev_kind == "free"), f"uncoalesced free blocks at {off}"
        pos = off + size
        prev_kind = kind
    assert pos == alloc.capacity
    assert alloc.allocated == sum(alloc.aligned(s) for s in live.values())


ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(min_value=1, max_value=5000)),
        st.tuples(st.just("free"), st.integers(min_value=0, max_value=10_000)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(min_value=0, max_value=64_000),
    alignment=st.sampled_from([1, 8, 64, 256]),
    seq=ops,
)
def test_random_alloc_free_never_overlaps_and_coalesces_fully(
    capacity: int, alignment: int, seq: list[tuple[str, int]]
) -> None:
    alloc = OffsetAllocator(capacity, alignment)
    live: dict[int, int] = {}
    for op, n in seq:
        if op == "alloc":
            off = alloc.alloc(n)
            if off is None:
                # It may only refuse when no free block is big enough.
                assert all(size < alloc.aligned(n) for _, size in alloc.free_blocks())
            else:
                assert off not in live
                live[off] = n
        elif live:
            off = sorted(live)[n % len(live)]
            alloc.free(off, live.pop(off))
        _check_invariants(alloc, live)
    for off, size in list(live.items()):
        alloc.free(off, size)
        del live[off]
    _check_invariants(alloc, live)
    assert alloc.free_blocks() == ([(0, alloc.capacity)] if alloc.capacity else [])
    assert alloc.allocated == 0


def test_sizes_and_offsets_are_aligned() -> None:
    alloc = OffsetAllocator(1 << 20, alignment=64)
    offs = [alloc.alloc(1), alloc.alloc(65), alloc.alloc(64)]
    assert all(o is not None and o % 64 == 0 for o in offs)
    assert alloc.allocated == 64 + 128 + 64


def test_capacity_is_rounded_down_to_the_alignment() -> None:
    assert OffsetAllocator(1000, alignment=64).capacity == 960


def test_an_exact_fit_of_the_whole_segment_is_found() -> None:
    # 1000 units is not a bin boundary: the O(1) search alone would miss it.
    alloc = OffsetAllocator(1000 * 64, alignment=64)
    assert alloc.alloc(1000 * 64) == 0
    assert alloc.alloc(1) is None
    alloc.free(0, 1000 * 64)
    assert alloc.free_blocks() == [(0, 64_000)]


def test_freeing_the_middle_block_merges_both_neighbours() -> None:
    alloc = OffsetAllocator(3 * 64, alignment=64)
    a, b, c = alloc.alloc(64), alloc.alloc(64), alloc.alloc(64)
    assert None not in (a, b, c)
    assert alloc.alloc(64) is None
    alloc.free(a, 64)  # type: ignore[arg-type]
    alloc.free(c, 64)  # type: ignore[arg-type]
    assert len(alloc.free_blocks()) == 2
    alloc.free(b, 64)  # type: ignore[arg-type]
    assert alloc.free_blocks() == [(0, 192)]
    assert alloc.largest_free() == 192


def test_double_free_is_refused() -> None:
    alloc = OffsetAllocator(1024, alignment=64)
    off = alloc.alloc(64)
    assert off is not None
    alloc.free(off, 64)
    with pytest.raises(ValueError):
        alloc.free(off, 64)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        OffsetAllocator(1024, alignment=48)
    with pytest.raises(ValueError):
        OffsetAllocator(1024).alloc(0)
    with pytest.raises(ValueError):
        OffsetAllocator(1024).free(3, 64)


def test_many_small_allocations_fill_the_segment_exactly() -> None:
    alloc = OffsetAllocator(4096 * 64, alignment=64)
    offs = [alloc.alloc(64) for _ in range(4096)]
    assert sorted(offs) == [i * 64 for i in range(4096)]  # type: ignore[type-var]
    assert alloc.alloc(64) is None
    for o in offs[::2]:
        alloc.free(o, 64)  # type: ignore[arg-type]
    assert alloc.alloc(128) is None  # fragmented: no two free blocks are adjacent
    for o in offs[1::2]:
        alloc.free(o, 64)  # type: ignore[arg-type]
    assert alloc.free_blocks() == [(0, 4096 * 64)]


def test_alloc_at_takes_exactly_a_free_range_and_nothing_else() -> None:
    alloc = OffsetAllocator(64 * 100, alignment=64)
    assert alloc.alloc_at(640, 100)  # rounded out to [640, 768)
    assert alloc.allocated == 128
    assert alloc.free_blocks() == [(0, 640), (768, 64 * 100 - 768)]
    assert not alloc.alloc_at(700, 64)  # overlaps the taken range
    assert not alloc.alloc_at(64 * 99, 128)  # runs past the end
    assert not alloc.alloc_at(-64, 64) and not alloc.alloc_at(0, 0)
    got = [alloc.alloc(64) for _ in range(98)]
    assert None not in got and 640 not in got and 704 not in got
    alloc.free(640, 100)
    for o in got:
        alloc.free(o, 64)  # type: ignore[arg-type]
    assert alloc.free_blocks() == [(0, 64 * 100)] and alloc.allocated == 0


def test_free_neighbours_are_found_by_their_edges() -> None:
    alloc = OffsetAllocator(64 * 10, alignment=64)
    offs = [alloc.alloc(64) for _ in range(10)]
    assert offs == [i * 64 for i in range(10)]
    alloc.free(64, 64)
    alloc.free(128, 64)  # one free block [64, 192)
    alloc.free(320, 64)  # [320, 384)
    assert alloc.free_ending_at(64 * 3) == 128 and alloc.free_starting_at(64) == 128
    assert alloc.free_ending_at(64 * 6) == 64 and alloc.free_starting_at(64 * 5) == 64
    # Not an edge of a free block (inside one, an allocated edge, misaligned): nothing.
    assert alloc.free_ending_at(128) == 0 and alloc.free_starting_at(128) == 0
    assert alloc.free_ending_at(64 * 8) == 0 and alloc.free_starting_at(0) == 0
    assert alloc.free_ending_at(100) == 0 and alloc.free_starting_at(100) == 0
