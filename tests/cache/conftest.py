"""Fixtures of the kvpool.cache tests: a real moto S3 server over HTTP on a loopback port."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kvtest.procs import free_port


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server (server mode, HTTP on 127.0.0.1); yields its endpoint URL."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        if os.environ.get("KVPOOL_REQUIRE_SERVICES") == "1":
            pytest.fail("moto[server] is required (KVPOOL_REQUIRE_SERVICES=1)")
        pytest.skip("moto[server] is not installed")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kvpool_master_for_l2() -> Iterator[str]:
    """A real pool (`kvpool master` + one `kvpool node`, child processes); yields HOST:PORT."""
    try:
        from kvtest.pool import start_pool
    except ImportError:  # pragma: no cover - the pool fixture module is part of the repo
        pytest.skip("kvtest.pool is not available")
    pool = start_pool(nodes=1, segment_size="256MiB")
    try:
        yield pool.address
    finally:
        pool.stop()
