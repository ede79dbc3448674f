"""The data plane of a pool with credentials (docs/security.md, "Data plane").

A real `kvpool master --auth-file` child process; the node is a `Store` with a node token and a
segment, whose transfer server makes every connection prove the key the master handed it.
Clients: a `Store` with a client token on TCP, raw sockets that skip the proof, and an engine
holding the key of another pool (a second master, other tokens)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool import Store
from kvpool.errors import ErrorCode
from kvpool.protocol import messages as m
from kvpool.rpc import RpcClient
from kvpool.transfer import SegmentLocation, TransferEngine, TransferOp, TransferRequest
from kvpool.transfer.proof import CHALLENGE, CHALLENGE_MAGIC
from kvpool.transfer.wire import REQ, REQ_MAGIC
from kvtest.procs import Proc, kvpool_proc

NODE = "pool-one-node-token-00000000000001"
CLIENT = "pool-one-client-token-000000000002"
ADMIN = "pool-one-admin-token-0000000000003"
OTHER_ADMIN = "pool-two-admin-token-0000000000004"
OTHER_NODE = "pool-two-node-token-00000000000005"


def _master(tmp: Path, name: str, text: str) -> Proc:
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return kvpool_proc("master", "--port", "0", "--auth-file", str(path), name=name)


@pytest.fixture(scope="module")
def masters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("dataplane")
    one = _master(
        tmp,
        "one",
        f"tokens:\n  - {{token: {NODE}, tenant: a, role: node}}\n"
        f"  - {{token: {CLIENT}, tenant: a, role: client}}\n"
        f"  - {{token: {ADMIN}, tenant: ops, role: admin}}\n",
    )
    two = _master(
        tmp,
        "two",
        f"tokens:\n  - {{token: {OTHER_ADMIN}, tenant: ops, role: admin}}\n"
        f"  - {{token: {OTHER_NODE}, tenant: a, role: node}}\n",
    )
    try:
        yield one.wait_ready(), two.wait_ready()
    finally:
        assert one.stop() == 0, one.output()
        assert two.stop() == 0, two.output()


@pytest.fixture(scope="module")
def node(masters: tuple[str, str]) -> Iterator[tuple[Store, SegmentLocation]]:
    master = masters[0]
    store = Store(master, segment_size="16MiB", token=NODE, protocol="tcp")
    try:
        with RpcClient(master, response_type=m.Response, token=ADMIN.encode()) as admin:
            seg = admin.call_as(m.Stats(), m.StatsReply).segments[0]
        yield store, SegmentLocation(seg.name, seg.capacity, "elsewhere", seg.endpoint, "")
    finally:
        store.close()


def _key_of(master: str, token: str) -> bytes | None:
    with RpcClient(master, response_type=m.Response, token=token.encode()) as c:
        c.connect()
        return c.data_key


def test_every_proven_connection_of_a_pool_gets_the_same_key_and_another_pool_another(
    masters: tuple[str, str],
) -> None:
    one, two = masters
    keys = {_key_of(one, t) for t in (NODE, CLIENT, ADMIN)}
    assert len(keys) == 1 and None not in keys
    assert _key_of(two, OTHER_NODE) not in keys


def test_a_store_with_a_client_token_puts_and_gets_over_tcp(
    masters: tuple[str, str], node: tuple[Store, SegmentLocation]
) -> None:
    with Store(masters[0], token=CLIENT, protocol="tcp") as client:
        value = bytes(range(256)) * 4096  # 1 MiB
        client.put("tcp-key", value)
        assert client.get("tcp-key") == value
        client.batch_put([f"b{i}" for i in range(8)], [bytes([i]) * 5000 for i in range(8)])
        assert client.batch_get([f"b{i}" for i in range(8)]) == [
            bytes([i]) * 5000 for i in range(8)
        ]


def _raw(loc: SegmentLocation) -> socket.socket:
    host, port = loc.endpoint.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _until_closed(s: socket.socket) -> bytes:
    got = b""
    while True:
        try:
            chunk = s.recv(1 << 16)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


@pytest.mark.parametrize("op", [TransferOp.READ, TransferOp.WRITE])
def test_a_raw_connection_to_the_nodes_server_that_skips_the_proof_gets_nothing(
    masters: tuple[str, str], node: tuple[Store, SegmentLocation], op: TransferOp
) -> None:
    store, loc = node
    with Store(masters[0], token=CLIENT, protocol="tcp") as client:
        client.put("victim", b"v" * 4096)
    name = loc.name.encode()
    n = 4096
    head = REQ.pack(REQ_MAGIC, int(op), 0, len(name), 1, 0, n) + name
    with _raw(loc) as s:
        with contextlib.suppress(OSError):  # closed under us: as good
            s.sendall(head + (b"x" * n if op is TransferOp.WRITE else head))
        got = _until_closed(s)
    assert len(got) == CHALLENGE.size and got.startswith(CHALLENGE_MAGIC)
    assert store.get("victim") == b"v" * 4096


def test_the_key_of_another_pool_moves_no_byte(
    masters: tuple[str, str], node: tuple[Store, SegmentLocation]
) -> None:
    store, loc = node
    with Store(masters[0], token=CLIENT, protocol="tcp") as client:
        client.put("guarded", b"g" * 8192)
    other = _key_of(masters[1], OTHER_NODE)
    engine = TransferEngine(lambda _n: loc, "tcp", stall_timeout=3.0, data_key=lambda: other)
    try:
        out = bytearray(loc.size)
        read = TransferRequest(TransferOp.READ, out, loc.name, 0)
        assert engine.transfer_batch([read], timeout=10) == [ErrorCode.TRANSFER_FAIL]
        assert out == bytearray(loc.size)
        write = TransferRequest(TransferOp.WRITE, b"\xee" * loc.size, loc.name, 0)
        assert engine.transfer_batch([write], timeout=10) == [ErrorCode.TRANSFER_FAIL]
    finally:
        engine.close()
    assert store.get("guarded") == b"g" * 8192
