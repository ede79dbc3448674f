"""The handshake rules, without I/O (the live refusals are in tests/rpc)."""

from __future__ import annotations

import msgspec
import pytest

from kvpool.errors import ErrorCode, IllegalClient, InvalidParams
from kvpool.protocol.handshake import (
    PROTOCOL_VERSION,
    Hello,
    Welcome,
    check_hello,
    check_welcome,
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
