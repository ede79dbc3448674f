"""Fixtures for the RPC tests: a live test service on an ephemeral loopback port, and clients."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvpool.rpc.client import RpcClient
from kvpool.rpc.thread import ServerThread
from rpc.rpc_testkit import CLUSTER, Response, server_thread


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """The test service in a background thread (its own loop); stopped after the test."""
    st = server_thread()
    try:
        yield st
    finally:
        st.stop()


@pytest.fixture
def client(server: ServerThread) -> Iterator[RpcClient]:
    c = RpcClient(server.endpoint, response_type=Response, cluster_id=CLUSTER, client_name="t1")
    try:
        yield c
    finally:
        c.close()
