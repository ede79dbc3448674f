"""The lock-step call path of `RpcClient` (`Channel.read_own`): one recv that holds exactly the
caller's reply is filed at once; anything else (a reply larger than one recv, an error reply,
a reply that does not decode, a reply with another id) goes through the leader's loop with
what was read, with the same outcome as before the fast path. Run on both transports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvpool.errors import ErrorCode, KVPoolError, ObjectNotFound
from kvpool.rpc.client import RpcClient
from kvpool.rpc.thread import ServerThread
from rpc.rpc_testkit import CLUSTER, Add, Big, Boom, Missing, Response, Said, Say, Sum

pytestmark = pytest.mark.usefixtures("transport")


@pytest.fixture
def sums_only(server: ServerThread) -> Iterator[RpcClient]:
    """A client that decodes only `Sum` replies: any other reply is undecodable to it."""
    c = RpcClient(server.endpoint, response_type=Sum, cluster_id=CLUSTER, client_name="sums")
    try:
        yield c
    finally:
        c.close()


def test_lock_step_calls_alternate_fast_and_slow_replies_in_order(client: RpcClient) -> None:
    for i in range(50):
        assert client.call(Add(i, 1)) == Sum(i + 1)
        # Larger than one recv (64 KiB): read in parts by the leader's loop after the first.
        assert client.call(Big(200_000)) == Said("x" * 200_000)
        with pytest.raises(ObjectNotFound):
            client.call(Missing(f"k{i}"))  # an ErrorReply (its id has the error flag)
        with pytest.raises(KVPoolError) as info:
            client.call(Boom("no"))
        assert info.value.code == ErrorCode.INTERNAL_ERROR
        assert client.call(Say(f"s{i}")) == Said(f"s{i}")


def test_an_undecodable_reply_fails_its_call_only(sums_only: RpcClient) -> None:
    for i in range(20):
        with pytest.raises(KVPoolError) as info:
            sums_only.call(Say("not a Sum"))
        assert info.value.code == ErrorCode.DESERIALIZE_FAIL
        assert sums_only.call(Add(i, 2)) == Sum(i + 2)  # the connection still serves


def test_a_short_timeout_then_a_long_one_both_answer(client: RpcClient) -> None:
    # The kernel receive timeout set for the short call is far too short for the long one:
    # the fast path leaves it to the loop, which resets it (no early failure).
    assert client.call(Add(1, 1), timeout=0.5) == Sum(2)
    assert client.call(Add(2, 2), timeout=30) == Sum(4)
    assert client.call(Add(3, 3), timeout=0.5) == Sum(6)


def test_response_union_client_sees_each_reply_type(server: ServerThread) -> None:
    with RpcClient(
        server.endpoint, response_type=Response, cluster_id=CLUSTER, client_name="u"
    ) as c:
        assert [c.call(Add(i, i)) for i in range(10)] == [Sum(2 * i) for i in range(10)]
