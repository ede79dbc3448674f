"""The handshake rules, without I/O (the live refusals are in tests/rpc)."""

from __future__ import annotations

import msgspec
import pytest

from kvpool.errors import ErrorCode, IllegalClient, InvalidParams, RpcError
from kvpool.protocol.handshake import (
    PROTOCOL_VERSION,
    UNIX_ADDRESS_MAX_BYTES,
    Hello,
    Welcome,
    check_hello,
    check_unix_welcome,
    check_welcome,
    is_abstract_unix_address,
)


def test_matching_hello_is_accepted() -> None:
    assert check_hello(Hello(PROTOCOL_VERSION, "c1", "me"), cluster_id="c1") is None


def test_other_protocol_version_is_refused_with_invalid_version() -> None:
    refusal = check_hello(Hello(PROTOCOL_VERSION + 1, "c1"), cluster_id="c1")
    assert refusal is not None
    assert refusal.code == ErrorCode.INVALID_VERSION


def test_other_cluster_is_refused_with_illegal_client() -> None:
    refusal = check_hello(Hello(PROTOCOL_VERSION, "c2"), cluster_id="c1")
    assert refusal is not None
    assert refusal.code == ErrorCode.ILLEGAL_CLIENT


def test_client_rejects_a_welcome_from_another_cluster_or_version() -> None:
    assert check_welcome(Welcome(PROTOCOL_VERSION, "c1", "s"), cluster_id="c1") is None
    assert isinstance(
        check_welcome(Welcome(PROTOCOL_VERSION, "c2", "s"), cluster_id="c1"), IllegalClient
    )
    err = check_welcome(Welcome(PROTOCOL_VERSION + 1, "c1", "s"), cluster_id="c1")
    assert isinstance(err, InvalidParams)
    assert err.code == ErrorCode.INVALID_VERSION


def test_hello_round_trips_and_bounds_its_fields() -> None:
    hello = Hello(PROTOCOL_VERSION, "c1", "client-7", b"proof")
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(hello), type=Hello) == hello
    too_long = msgspec.msgpack.encode(Hello(PROTOCOL_VERSION, "c" * 300))
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(too_long, type=Hello)


class _OldWelcome(msgspec.Struct, tag="Welcome", frozen=True):
    """The Welcome of a server from before the Unix socket (no unix_address field)."""

    protocol_version: int
    cluster_id: str
    server_name: str = ""


def test_a_welcome_without_unix_address_still_decodes_as_having_no_unix_socket() -> None:
    old = msgspec.msgpack.encode(_OldWelcome(PROTOCOL_VERSION, "c1", "old-master"))
    welcome = msgspec.msgpack.decode(old, type=Welcome)
    assert welcome == Welcome(PROTOCOL_VERSION, "c1", "old-master")
    assert welcome.unix_address == ""


def test_a_welcome_with_unix_address_round_trips_and_old_clients_ignore_it() -> None:
    welcome = Welcome(PROTOCOL_VERSION, "c1", "m", "\0kvpool-rpc/c1/42/00ff")
    wire = msgspec.msgpack.encode(welcome)
    assert msgspec.msgpack.decode(wire, type=Welcome) == welcome
    assert msgspec.msgpack.decode(wire, type=_OldWelcome) == _OldWelcome(
        PROTOCOL_VERSION, "c1", "m"
    )
    hello = Hello(PROTOCOL_VERSION, "c1", "me")
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(hello), type=Hello) == hello


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("\0kvpool-rpc/c1/42/00ff", True),
        ("\0" + "x" * (UNIX_ADDRESS_MAX_BYTES - 1), True),
        ("\0" + "x" * UNIX_ADDRESS_MAX_BYTES, False),  # one byte over sun_path
        ("\0", False),
        ("", False),
        ("/run/kvpool.sock", False),  # a file: never followed
        ("kvpool-rpc", False),
    ],
)
def test_only_abstract_unix_names_that_fit_are_followed(address: str, ok: bool) -> None:
    assert is_abstract_unix_address(address) is ok


def test_the_unix_welcome_must_name_the_same_socket_and_cluster() -> None:
    name = "\0kvpool-rpc/c1/42/00ff"
    same = Welcome(PROTOCOL_VERSION, "c1", "m", name)
    assert check_unix_welcome(same, cluster_id="c1", unix_address=name) is None
    other_socket = Welcome(PROTOCOL_VERSION, "c1", "m", "\0kvpool-rpc/c1/43/abcd")
    err = check_unix_welcome(other_socket, cluster_id="c1", unix_address=name)
    assert isinstance(err, RpcError) and err.code == ErrorCode.RPC_FAIL
    other_cluster = Welcome(PROTOCOL_VERSION, "c2", "m", name)
    assert isinstance(
        check_unix_welcome(other_cluster, cluster_id="c1", unix_address=name), IllegalClient
    )
