"""Stores a test opens, each closed when the test ends (also when it fails).

The suite's `stores` fixture (tests/conftest.py) is the list a test appends its Stores to;
`open_store` makes one and appends it. `emptied_after` is a Store for tests that share one pool
(a module's `pool_module`): every object goes when the test ends, so the next test starts on an
empty pool. `stores_last_first` is that fixture closing the
last-made Store first, for tests whose first Store gives the memory the later ones use: import
it into a test module to take the place of `stores` there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kvpool.client import Store

__all__ = ["emptied_after", "open_store", "stores_last_first"]


def open_store(made: list[Store], address: str, rpc_timeout: float = 20.0, **options: Any) -> Store:
    """`Store(address, rpc_timeout=..., **options)`, appended to `made` (the test closes it)."""
    s = Store(address, rpc_timeout=rpc_timeout, **options)
    made.append(s)
    return s


@contextmanager
def emptied_after(address: str, **options: Any) -> Iterator[Store]:
    """`Store(address, **options)` for the block; it removes every object (force) before it
    closes, also when the block fails."""
    with Store(address, **options) as s:
        try:
            yield s
        finally:
            s.remove_all(force=True)


@pytest.fixture(name="stores")
def stores_last_first() -> Iterator[list[Store]]:
    """Like the suite's `stores`, closed in the reverse order of their making."""
    made: list[Store] = []
    yield made
    for s in reversed(made):
        s.close()
