"""ObjectKey validation and encoding; the token-chunk hasher is deterministic across processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.cache.keys import ObjectKey, TokenHasher, compute_kv_rank
from kvpool.errors import InvalidParams


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model_name": "", "kv_rank": 0, "chunk_hash": b"x"},
        {"model_name": "m\x00", "kv_rank": 0, "chunk_hash": b"x"},
        {"model_name": "m" * 257, "kv_rank": 0, "chunk_hash": b"x"},
        {"model_name": "m", "kv_rank": -1, "chunk_hash": b"x"},
        {"model_name": "m", "kv_rank": 1 << 32, "chunk_hash": b"x"},
        {"model_name": "m", "kv_rank": True, "chunk_hash": b"x"},
        {"model_name": "m", "kv_rank": 0, "chunk_hash": b""},
        {"model_name": "m", "kv_rank": 0, "chunk_hash": "ab"},
        {"model_name": "m", "kv_rank": 0, "chunk_hash": b"x" * 65},
        {"model_name": "m", "kv_rank": 0, "chunk_hash": b"x", "object_group_id": -1},
        {"model_name": "m", "kv_rank": 0, "chunk_hash": b"x", "cache_salt": "s" * 129},
    ],
)
def test_invalid_keys_are_refused_with_invalid_params(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidParams):
        ObjectKey(**kwargs)  # type: ignore[arg-type]


@given(
    model=st.text(min_size=1, max_size=60).filter(lambda s: "\x00" not in s),
    rank=st.integers(0, (1 << 32) - 1),
    h=st.binary(min_size=1, max_size=64),
    group=st.integers(0, 65535),
    salt=st.text(max_size=20).filter(lambda s: "\x00" not in s),
)
def test_to_string_round_trips_any_model_name_and_uses_only_safe_characters(
    model: str, rank: int, h: bytes, group: int, salt: str
) -> None:
    key = ObjectKey(model, rank, h, group, salt)
    text = key.to_string()
    assert ObjectKey.from_string(text) == key
    assert set(text) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~%@-")
    assert "/" not in text


def test_keys_with_different_fields_have_different_strings() -> None:
    base = ObjectKey("a@b", 1, b"\x01")
    others = [
        ObjectKey("a", 1, b"\x01"),
        ObjectKey("a@b", 2, b"\x01"),
        ObjectKey("a@b", 1, b"\x02"),
        ObjectKey("a@b", 1, b"\x01", 1),
        ObjectKey("a@b", 1, b"\x01", 0, "salt"),
    ]
    assert len({base.to_string(), *(o.to_string() for o in others)}) == 6


def test_compute_kv_rank_packs_fields_and_validates() -> None:
    assert compute_kv_rank(2, 1, 2, 1) == (2 << 24) | (1 << 16) | (2 << 8) | 1
    with pytest.raises(InvalidParams):
        compute_kv_rank(2, 2, 2, 0)


def test_hasher_hashes_only_full_chunks_and_chains_prefixes() -> None:
    h = TokenHasher(chunk_size=4)
    tokens = list(range(10))
    hashes = h.chunk_hashes(tokens)
    assert len(hashes) == 2  # the partial third chunk has no key
    assert len(set(hashes)) == 2
    # Chaining: the second chunk's hash depends on the first chunk's tokens.
    other = h.chunk_hashes([99, 1, 2, 3, 4, 5, 6, 7])
    assert other[1] != hashes[1]
    # Resuming from a prefix hash gives the same chain.
    assert h.chunk_hashes(tokens[4:8], prefix_hash=hashes[0]) == [hashes[1]]


def test_hasher_rejects_bad_input() -> None:
    with pytest.raises(InvalidParams):
        TokenHasher(chunk_size=0)
    with pytest.raises(InvalidParams):
        TokenHasher(4).chunk_hashes([-1, 0, 0, 0])
    with pytest.raises(InvalidParams):
        TokenHasher(4).chunk_hashes([[1, 2], [3, 4]])


def test_hasher_is_identical_in_a_process_with_another_hash_seed() -> None:
    tokens = list(range(1000, 1000 + 512))
    here = [x.hex() for x in TokenHasher().chunk_hashes(tokens)]
    code = (
        "from kvpool.cache.keys import TokenHasher;"
        "print(','.join(x.hex() for x in TokenHasher().chunk_hashes(list(range(1000, 1512)))))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip().split(",") == here
    assert len(here) == 2


def test_keys_helper_builds_one_key_per_full_chunk() -> None:
    ks = TokenHasher(chunk_size=256).keys("m", 0, list(range(600)))
    assert len(ks) == 2
    assert all(k.model_name == "m" and len(k.chunk_hash) == 16 for k in ks)
