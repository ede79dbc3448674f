"""Review findings on the master's invalidation hub (src/kvpool/master/invalidation.py).

`InvalidationHub.subscribe` keeps one `dict` per tenant named by a `Subscribe`
(`self._by_tenant.setdefault(req.tenant, ...)`) and never drops it: not when its connection
closes (`flush` / `_prune` delete the connection's queue, not the tenant's entry), not when the
subscription is refused past `max_subscribers` (the `setdefault` comes first). `Subscribe` is
served before the request guard, and its tenant has no length bound, so every distinct tenant
name any peer ever subscribed stays in the master's memory for its lifetime, and every push
(`flush`) and every `everything` walks all of them. The module docstring promises bounds (at
most `max_subscribers` subscriptions); memory is not bounded by them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvpool.client import Store
from kvpool.codes import INVALID_PARAMS
from kvpool.protocol.invalidation import Subscribe
from kvpool.protocol.messages import Reply, Response, TenantId
from kvpool.rpc.client import RpcClient
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until

_NAME_BYTES = 1 << 20
_SUBSCRIPTIONS = 160


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def one_node(pool: PoolFactory) -> Iterator[Pool]:  # noqa: F811
    yield pool(nodes=1, segment_size="16MiB")


def test_closed_subscriptions_release_their_tenant_names(one_node: Pool) -> None:
    pid = one_node.master.pid
    # A cached Store of the default tenant: its put + remove make the hub push (flush), which
    # drops the queues of closed connections.
    with Store(one_node.address, read_mode="cached") as store:
        store.put("warm", b"x" * 64)
        store.remove("warm")
        base = _rss(pid)
        for i in range(_SUBSCRIPTIONS):
            rpc = RpcClient(one_node.address, response_type=Response, timeout=10.0)
            try:
                name = TenantId(f"{i:08d}" + "t" * (_NAME_BYTES - 8))
                reply = rpc.call_as(Subscribe(name), Reply)
                assert reply.code == INVALID_PARAMS  # a name no Store may have
                # and a subscription the hub takes, whose tenant goes with its connection
                reply = rpc.call_as(Subscribe(TenantId(f"{i:08d}" + "t" * 247)), Reply)
                assert reply.code == 0
            finally:
                rpc.close()
        # Every one of those connections is closed; one more push drops their queues.
        store.put("again", b"y" * 64)
        store.remove("again")
        grown = _rss(pid) - base
        # Without the leak the 160 MiB of names go with their connections (large strings are
        # their own mmaps: freeing them returns the memory at once).
        wait_until(
            lambda: _rss(pid) - base < 48 << 20,
            timeout=5.0,
            what=f"the master to release the subscribed tenant names (grew {grown >> 20} MiB)",
        )


class _Conn:
    """What the hub uses of a connection: `closed` and `push`."""

    def __init__(self) -> None:
        self.closed = False
        self.pushed: list[object] = []

    def push(self, request_id: int, msg: object) -> bool:
        self.pushed.append(msg)
        return True


def test_the_hub_forgets_a_tenant_with_its_last_subscription_and_keeps_nothing_it_refused() -> None:
    from kvpool.master.invalidation import InvalidationHub

    hub = InvalidationHub(max_subscribers=4)
    conns = [_Conn() for _ in range(4)]
    for i, c in enumerate(conns):
        assert hub.subscribe(Subscribe(TenantId(f"t{i}")), c).code == 0  # type: ignore[arg-type]
    # Full: a fifth tenant is refused and leaves no entry behind.
    assert hub.subscribe(Subscribe(TenantId("t-refused")), _Conn()).code != 0  # type: ignore[arg-type]
    assert set(hub._by_tenant) == {"t0", "t1", "t2", "t3"}
    for c in conns[:3]:
        c.closed = True
    hub.flush()
    assert set(hub._by_tenant) == {"t3"}
    # At the limit, closed subscriptions are pruned (tenants with them) to admit a new one.
    more = [_Conn() for _ in range(3)]
    for i, c in enumerate(more):
        assert hub.subscribe(Subscribe(TenantId(f"u{i}")), c).code == 0  # type: ignore[arg-type]
    conns[3].closed = True
    assert hub.subscribe(Subscribe(TenantId("t-new")), _Conn()).code == 0  # type: ignore[arg-type]
    assert set(hub._by_tenant) == {"u0", "u1", "u2", "t-new"}
