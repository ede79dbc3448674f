"""Bitmap: the per-key result type of lookups and loads, checked against a set-of-ints model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.cache.bitmap import Bitmap
from kvpool.errors import InvalidParams

sizes = st.integers(0, 200)


@st.composite
def bitmap_and_set(draw: st.DrawFn, size: int | None = None) -> tuple[Bitmap, set[int]]:
    n = draw(sizes) if size is None else size
    idx = draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n)) if n else set()
    return Bitmap.from_indices(n, idx), idx


@given(bitmap_and_set())
def test_counts_match_a_set_model(pair: tuple[Bitmap, set[int]]) -> None:
    bm, s = pair
    n = bm.size
    assert bm.popcount() == len(s)
    assert bm.get_indices_list() == sorted(s)
    lead = 0
    while lead < n and lead in s:
        lead += 1
    assert bm.count_leading_ones() == lead
    zeros = 0
    while zeros < n and zeros not in s:
        zeros += 1
    assert bm.count_leading_zeros() == zeros
    assert bm.highest_set_bit() == (max(s) if s else -1)
    assert (~bm).get_indices_set() == set(range(n)) - s


@given(st.data())
def test_and_or_without_prefix_match_set_operations(data: st.DataObject) -> None:
    n = data.draw(sizes)
    a, sa = data.draw(bitmap_and_set(n))
    b, sb = data.draw(bitmap_and_set(n))
    assert (a & b).get_indices_set() == sa & sb
    assert (a | b).get_indices_set() == sa | sb
    assert a.without(b).get_indices_set() == sa - sb
    assert a.overlaps(b) == bool(sa & sb)
    k = data.draw(st.integers(0, n))
    assert a.prefix(k).get_indices_set() == {i for i in sa if i < k}


def test_prefix_constructor_set_range_and_gather() -> None:
    bm = Bitmap(6, 3)
    assert repr(bm) == "Bitmap('111000')"
    bm.set_range(4, 6)
    assert bm.gather(list("abcdef")) == ["a", "b", "c", "e", "f"]
    assert bm.count_leading_ones() == 3
    bm.clear(0)
    assert bm.count_leading_ones() == 0
    assert not bm.test(0) and bm[1]


def test_and_or_truncate_to_the_smaller_size() -> None:
    assert (Bitmap(4, 4) & Bitmap(2, 2)) == Bitmap(2, 2)
    assert (Bitmap(4, 4) | Bitmap(2, 0)).size == 2


def test_full_bitmap_leading_ones_is_its_size() -> None:
    assert Bitmap(64, 64).count_leading_ones() == 64
    assert Bitmap(0).count_leading_ones() == 0


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Bitmap(-1),
        lambda: Bitmap(3, 4),
        lambda: Bitmap(3).set(3),
        lambda: Bitmap(3).set_range(2, 5),
    ],
)
def test_out_of_range_is_invalid_params(bad: object) -> None:
    with pytest.raises(InvalidParams):
        bad()  # type: ignore[operator]
