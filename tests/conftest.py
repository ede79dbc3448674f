"""Fixtures shared by the whole suite. Package-specific fixtures live in each tests/<pkg>/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvpool.client import Store
from kvtest.procs import Proc, free_port, require_binary, wait_until

#: etcd fixtures (`etcd_shared`, `gateway`, `cluster`) for every test that needs them.
pytest_plugins = ["kvtest.etcd", "kvtest.ha"]


@pytest.fixture
def redis_server() -> Iterator[str]:
    """A private redis-server on a loopback port, no persistence; yields "127.0.0.1:PORT"."""
    binary = require_binary("redis-server")
    port = free_port()
    proc = Proc(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        name="redis-server",
    )
    try:
        proc.wait_for_line(r"Ready to accept connections", timeout=15)
        yield f"127.0.0.1:{port}"
    finally:
        proc.stop()


__all__ = ["wait_until"]


@pytest.fixture
def stores() -> Iterator[list[Store]]:
    """A list a test appends the Stores it makes to; each is closed when the test ends."""
    made: list[Store] = []
    yield made
    for s in made:
        s.close()
