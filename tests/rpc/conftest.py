"""Fixtures for the RPC tests: a live test service on an ephemeral loopback port, and clients."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kvpool.rpc.client import RpcClient
from kvpool.rpc.thread import ServerThread
from rpc import rpc_testkit
from rpc.rpc_testkit import CLUSTER, Response, server_thread


@pytest.fixture(autouse=True)
def _fresh_gather_groups() -> None:
    """Gather groups live in the test service's module: a test (or its second parametrized
    run) must not find a group an earlier one filled."""
    rpc_testkit._groups.clear()


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """The test service in a background thread (its own loop); stopped after the test."""
    st = server_thread()
    try:
        yield st
    finally:
        st.stop()


@pytest.fixture(params=["unix", "tcp"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with its clients on the server's Unix socket (the default) and again on TCP
    (``KVPOOL_RPC_UNIX=0``): a module that uses it checks every behaviour on both."""
    if request.param == "tcp":
        monkeypatch.setenv("KVPOOL_RPC_UNIX", "0")
    else:
        monkeypatch.delenv("KVPOOL_RPC_UNIX", raising=False)
    return str(request.param)


@pytest.fixture
def client(server: ServerThread) -> Iterator[RpcClient]:
    c = RpcClient(server.endpoint, response_type=Response, cluster_id=CLUSTER, client_name="t1")
    try:
        yield c
        if c.connected:  # the test ran on the transport it was meant to
            expected = "tcp" if os.environ.get("KVPOOL_RPC_UNIX") == "0" else "unix"
            assert c.transport == expected
    finally:
        c.close()
