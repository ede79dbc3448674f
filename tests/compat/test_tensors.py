"""The tensor API (needs torch; skipped without it): Mooncake's object format, byte for byte.

Each test runs on both backends, and each compares the stored bytes with the format built by
hand from Mooncake's C structs (`_tensor_object`), so a tensor written by Mooncake is
readable by kvpool and the other way round.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _tensor_object(dtype: int, shape: tuple[int, ...], data: bytes) -> bytes:
    """Mooncake's tensor object from its C structs (as in test_mooncake_api.py)."""
    dims = [*shape, *([-1] * (8 - len(shape)))]
    head = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, dtype, len(shape), 0, 0, 304, len(data))
    layout = struct.pack("<8q", *dims) * 2 + struct.pack("<II", 0, 0) + bytes(4 * 32)
    return head + layout + data


DTYPES = [
    ("float32", 0),
    ("float64", 1),
    ("int8", 2),
    ("uint8", 3),
    ("int32", 6),
    ("int64", 8),
    ("bool", 10),
    ("float16", 11),
    ("bfloat16", 12),
]


@pytest.mark.parametrize("name,code", DTYPES)
def test_put_tensor_writes_mooncakes_format(backend: Any, name: str, code: int) -> None:
    store = backend.store()
    t = (torch.arange(24) % 7).to(getattr(torch, name)).reshape(2, 3, 4)
    assert store.put_tensor(f"t-{name}", t) == 0
    raw = bytes(t.reshape(-1).view(torch.uint8).numpy())
    assert store.get(f"t-{name}") == _tensor_object(code, (2, 3, 4), raw)
    back = store.get_tensor(f"t-{name}")
    assert back.dtype == t.dtype and tuple(back.shape) == (2, 3, 4)
    assert torch.equal(back, t)


def test_batch_tensor_calls_and_misses(backend: Any) -> None:
    store = backend.store()
    ts = [torch.ones(3) * i for i in range(3)]
    assert store.batch_put_tensor(["b0", "b1", "b2"], ts) == [0, 0, 0]
    got = store.batch_get_tensor(["b0", "nope", "b2"])
    assert torch.equal(got[0], ts[0]) and got[1] is None and torch.equal(got[2], ts[2])
    assert store.upsert_tensor("b0", torch.zeros(2)) == 0
    assert torch.equal(store.get_tensor("b0"), torch.zeros(2))
    assert store.get_tensor("nope") is None
    cfg = backend.module.ReplicateConfig()
    cfg.with_hard_pin = True
    assert store.batch_pub_tensor(["p0", "p1"], ts[:2], cfg) == [0, 0]
    assert store.batch_upsert_pub_tensor(["p0"], [ts[2]], cfg) == [0]
    assert torch.equal(store.get_tensor("p0"), ts[2])


def test_get_tensor_into_registered_memory(backend: Any) -> None:
    store = backend.store()
    arena = ctypes.create_string_buffer(1 << 16)
    base = ctypes.addressof(arena)
    assert store.register_buffer(base, 1 << 16) == 0
    t = torch.arange(10, dtype=torch.float32)
    assert store.put_tensor("into", t) == 0
    got = store.get_tensor_into("into", base, 1 << 16)
    assert torch.equal(got, t)
    assert store.unregister_buffer(base) == 0
