"""Challenge-response authentication in the handshake, on TCP and on the Unix socket."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from kvpool.errors import ErrorCode, InvalidParams, Unauthenticated
from kvpool.protocol.framing import encode_frame
from kvpool.protocol.handshake import Hello, Proof, Welcome, auth_proof, token_key_id
from kvpool.rpc.aio import AsyncRpcClient
from kvpool.rpc.auth import Principal, Role, TokenTable, client_token
from kvpool.rpc.client import RpcClient
from kvpool.rpc.thread import ServerThread
from rpc.rpc_testkit import CLUSTER, Add, RawConn, Response, Sum, server_thread

pytestmark = pytest.mark.usefixtures("transport")

ALICE = b"alice-token-0123456789abcdef"
ADMIN = b"admin-token-0123456789abcdef"


@pytest.fixture
def secured() -> Iterator[ServerThread]:
    tokens = TokenTable(
        [(ALICE, Principal("alice", Role.CLIENT)), (ADMIN, Principal("ops", Role.ADMIN))]
    )
    st = server_thread(tokens=tokens)
    try:
        yield st
    finally:
        st.stop()


def _client(st: ServerThread, token: bytes | None) -> RpcClient:
    return RpcClient(
        st.endpoint, response_type=Response, cluster_id=CLUSTER, client_name="c", token=token
    )


def test_a_client_with_a_valid_token_is_served(secured: ServerThread, transport: str) -> None:
    with _client(secured, ALICE) as c:
        assert c.call(Add(1, 2)) == Sum(3)
        assert c.transport == transport
    conns = secured.server.connections()
    assert all(conn.principal is None or conn.principal.tenant == "alice" for conn in conns)


@pytest.mark.parametrize("token", [None, b"wrong-token-0123456789abcdef"])
def test_no_token_or_a_wrong_one_is_refused_unauthenticated(
    secured: ServerThread, token: bytes | None
) -> None:
    with _client(secured, token) as c, pytest.raises(Unauthenticated) as info:
        c.call(Add(1, 2))
    assert info.value.code == ErrorCode.UNAUTHENTICATED


def test_the_async_client_proves_its_token_too(secured: ServerThread) -> None:
    async def main() -> None:
        async with AsyncRpcClient(
            secured.endpoint, response_type=Response, cluster_id=CLUSTER, token=ADMIN
        ) as c:
            assert await c.call(Add(2, 2)) == Sum(4)
        async with AsyncRpcClient(
            secured.endpoint, response_type=Response, cluster_id=CLUSTER
        ) as c:
            with pytest.raises(Unauthenticated):
                await c.call(Add(2, 2))

    asyncio.run(main())


def _raw_endpoints(st: ServerThread) -> list[str]:
    return [st.endpoint, st.server.unix_address]


def test_a_raw_connection_gets_nothing_before_its_proof(secured: ServerThread) -> None:
    for endpoint in _raw_endpoints(secured):
        with RawConn(endpoint) as raw:
            welcome = raw.hello()
            assert isinstance(welcome, Welcome) and len(welcome.challenge) == 32
            raw.request(1, Add(1, 1))  # a request instead of the proof
            _, reply = raw.recv_reply()
            assert reply.code == ErrorCode.UNAUTHENTICATED
            assert raw.closed_by_peer()


def test_a_replayed_proof_fails_on_a_new_connection(secured: ServerThread) -> None:
    endpoint = secured.endpoint
    with RawConn(endpoint) as raw:
        nonce = raw.hello().challenge
        proof = Proof(token_key_id(ALICE), auth_proof(ALICE, nonce, CLUSTER, "raw"))
        raw.send(encode_frame(0, msgspec.msgpack.encode(proof)))
        _, payload = raw.recv_frame()
        welcome = msgspec.msgpack.decode(payload, type=Welcome)
        assert (welcome.challenge, welcome.tenant, welcome.role) == (b"", "alice", "client")
        raw.request(1, Add(5, 5))
        assert raw.recv_reply() == (1, Sum(10))
    with RawConn(endpoint) as raw:
        assert raw.hello().challenge != nonce
        raw.send(encode_frame(0, msgspec.msgpack.encode(proof)))
        _, reply = raw.recv_reply()
        assert reply.code == ErrorCode.UNAUTHENTICATED
        assert raw.closed_by_peer()
    assert secured.server.auth_failures >= 1


def test_a_server_without_credentials_sends_no_challenge(server: ServerThread) -> None:
    with RawConn(server.endpoint) as raw:
        welcome = raw.hello()
        assert welcome.challenge == b"" and welcome.tenant == ""
    with _client(server, ALICE) as c:  # a token the server does not need is not used
        assert c.call(Add(1, 1)) == Sum(2)


def test_the_table_is_replaced_whole_and_keeps_proven_connections(
    secured: ServerThread,
) -> None:
    with _client(secured, ALICE) as c:
        assert c.call(Add(1, 1)) == Sum(2)
        new = b"alice-rotated-0123456789abcdef"
        tokens = secured.server.tokens
        assert tokens is not None
        done = asyncio.run_coroutine_threadsafe(_replace(tokens, new), secured.loop)
        done.result(5)
        assert c.call(Add(1, 2)) == Sum(3)  # proven before the reload: still served
    with _client(secured, ALICE) as c, pytest.raises(Unauthenticated):
        c.call(Add(1, 1))
    with _client(secured, new) as c:
        assert c.call(Add(1, 1)) == Sum(2)


async def _replace(tokens: TokenTable, new: bytes) -> None:
    tokens.replace([(new, Principal("alice", Role.CLIENT))])


def test_short_or_duplicate_tokens_are_refused_and_leave_the_table_alone() -> None:
    table = TokenTable([(ALICE, Principal("alice", Role.CLIENT))])
    with pytest.raises(InvalidParams, match="at least 16"):
        table.replace([(b"short", Principal("x", Role.CLIENT))])
    with pytest.raises(InvalidParams, match="twice"):
        table.replace([(ADMIN, Principal("a", Role.ADMIN)), (ADMIN, Principal("b", Role.NODE))])
    assert len(table) == 1 and table.first(Role.CLIENT) == ALICE


def test_client_token_precedence_is_explicit_then_file_then_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "token"
    f.write_text("from-file\n")
    monkeypatch.setenv("KVPOOL_AUTH_TOKEN", "from-env")
    assert client_token("explicit", f) == b"explicit"
    assert client_token(None, f) == b"from-file"
    assert client_token(None, None) == b"from-env"
    monkeypatch.delenv("KVPOOL_AUTH_TOKEN")
    assert client_token(None, None) is None


def test_hello_and_welcome_of_older_peers_still_decode() -> None:
    old = msgspec.msgpack.encode(Hello(1, CLUSTER, "x"))
    assert msgspec.msgpack.decode(old, type=Hello).auth == b""
    w = msgspec.msgpack.decode(msgspec.msgpack.encode(Welcome(1, CLUSTER)), type=Welcome)
    assert w.challenge == b"" and w.role == ""


def test_the_data_key_follows_the_admin_tokens_and_the_cluster_only() -> None:
    """The data key (docs/security.md, "Data plane") is derived from the admin tokens and the
    cluster id: adding or removing client and node tokens on a reload keeps it, so nodes that
    fetched it earlier still admit new clients; another admin token or cluster changes it."""
    admin = (ADMIN, Principal("ops", Role.ADMIN))
    alice = (ALICE, Principal("alice", Role.CLIENT))
    node = (b"node-token-0123456789abcdef", Principal("alice", Role.NODE))
    table = TokenTable([admin, alice])
    key = table.data_key(CLUSTER)
    assert len(key) == 32
    table.replace([admin, alice, node])
    assert table.data_key(CLUSTER) == key
    table.replace([admin])
    assert table.data_key(CLUSTER) == key
    assert table.data_key("another-cluster") != key
    table.replace([(b"other-admin-0123456789abcdef", Principal("ops", Role.ADMIN)), alice])
    assert table.data_key(CLUSTER) != key
    # Without admin tokens every token counts.
    assert TokenTable([alice]).data_key(CLUSTER) != TokenTable([alice, node]).data_key(CLUSTER)


def test_the_wrapped_data_key_opens_only_with_the_token_and_the_nonce() -> None:
    from kvpool.protocol.handshake import token_key_id
    from kvpool.rpc.auth import unwrap_data_key

    table = TokenTable([(ALICE, Principal("alice", Role.CLIENT))])
    nonce = b"n" * 32
    wrapped = table.wrap_data_key(token_key_id(ALICE), nonce, CLUSTER, "c")
    assert wrapped != table.data_key(CLUSTER)
    assert unwrap_data_key(wrapped, ALICE, nonce, CLUSTER, "c") == table.data_key(CLUSTER)
    assert unwrap_data_key(wrapped, ADMIN, nonce, CLUSTER, "c") != table.data_key(CLUSTER)
    assert unwrap_data_key(wrapped, ALICE, b"m" * 32, CLUSTER, "c") != table.data_key(CLUSTER)
    assert unwrap_data_key(b"", ALICE, nonce, CLUSTER, "c") is None  # an older server's Welcome
    assert table.wrap_data_key(token_key_id(ADMIN), nonce, CLUSTER, "c") == b""
