"""kvpool.ha.election against a real etcd: one leader, fencing by deadline and term, handover.

The kill and freeze tests run each contender in a process of its own (tests/ha/contender.py),
which stamps its lines with CLOCK_MONOTONIC, one clock for the whole machine: so "the old
leader stopped believing before the new one began" is a comparison of two stamps. TTL 2 s (etcd's
minimum is about 1.5 s), so every test takes a few seconds.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from kvpool.ha import ClusterKeys, Election, ElectionConfig, EtcdGateway, LeaseConfig, Role
from kvtest.etcd import EtcdServer
from kvtest.procs import freeze, wait_until

TTL = 2


def _one_leader(procs: list[Any]) -> tuple[Any, int]:
    """The only contender whose last line says it leads, and its term (fails otherwise)."""
    leading = [(c, c.leading()[1]) for c in procs if c.leading()[0]]
    assert len(leading) == 1, [(c.member, c.leading()) for c in procs]
    return leading[0]


def _wait_one_leader(procs: list[Any], timeout: float, min_term: int = 0) -> tuple[Any, int]:
    def settled() -> tuple[Any, int] | None:
        leading = [(c, c.leading()[1]) for c in procs if c.leading()[0]]
        if len(leading) == 1 and leading[0][1] >= min_term:
            return leading[0]
        return None

    return wait_until(settled, timeout, what=f"exactly one leader with term >= {min_term}")


def test_three_contenders_elect_exactly_one_leader(
    etcd_shared: EtcdServer, cluster: str, contenders: Any
) -> None:
    procs = [contenders(etcd_shared.endpoint, cluster, m, TTL) for m in ("a", "b", "c")]
    leader, term = _wait_one_leader(procs, timeout=10)
    assert term >= 1
    # Everyone else follows that leader, in that term.
    for c in procs:
        if c is leader:
            continue
        wait_until(
            lambda c=c: any(
                r["leader"] == leader.member and int(r["term"]) == term
                for r in c.records("state")
                if r["rest"].startswith("follower")
            ),
            10,
            what=f"{c.member} to follow {leader.member}",
        )
    # And it stays that way for a few keepalive intervals.
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert _one_leader(procs)[0] is leader
        time.sleep(0.1)


def test_sigkill_of_the_leader_hands_over_within_the_ttl_with_a_higher_term(
    etcd_shared: EtcdServer, cluster: str, contenders: Any
) -> None:
    procs = [contenders(etcd_shared.endpoint, cluster, m, TTL) for m in ("a", "b")]
    leader, term = _wait_one_leader(procs, timeout=10)
    standby = next(c for c in procs if c is not leader)
    killed_at = time.monotonic()
    leader.proc.kill9()
    rec = standby.wait_leading(timeout=TTL + 3, min_term=term + 1)
    took = float(rec["at"]) - killed_at
    # The lease expires within TTL of the last keepalive; etcd checks expiry every 0.5 s.
    assert took < TTL + 1.5, f"standby took {took:.2f} s"
    assert int(rec["term"]) == term + 1


def test_a_frozen_leader_steps_down_before_its_lease_expires_and_never_reclaims_its_term(
    etcd_shared: EtcdServer, cluster: str, contenders: Any
) -> None:
    procs = [contenders(etcd_shared.endpoint, cluster, m, TTL) for m in ("a", "b")]
    old, term = _wait_one_leader(procs, timeout=10)
    new = next(c for c in procs if c is not old)
    freeze(old.proc.pid)
    won = new.wait_leading(timeout=TTL + 3, min_term=term + 1)
    new_term = int(won["term"])
    thawed_at = time.monotonic()
    os.kill(old.proc.pid, signal.SIGCONT)
    # On waking, the first thing the old leader says is that it does not lead.
    wait_until(lambda: old.records("deadline", thawed_at), 5, what="the old leader's deadline")
    after = old.records("leading", thawed_at)
    assert after and after[0]["rest"].startswith("0"), after
    # Its belief had ended before the new leader began (one machine-wide monotonic clock).
    believed_until = float(old.records("deadline", thawed_at)[0]["rest"])
    assert believed_until < float(won["at"]), (believed_until, won)
    # It follows the new leader and does not lead again while the new one keeps its lease.
    wait_until(
        lambda: any(
            r["leader"] == new.member and int(r["term"]) == new_term
            for r in old.records("state", thawed_at)
        ),
        5,
        what="the old leader to follow the new one",
    )
    time.sleep(TTL)  # a full TTL in which a wrong reclaim would show
    assert not any(r["rest"].startswith("1") for r in old.records("leading", thawed_at))
    assert _one_leader(procs) == (new, new_term)


def test_a_clean_resign_hands_over_at_once(
    etcd_shared: EtcdServer, cluster: str, contenders: Any
) -> None:
    ttl = 5  # handover must not wait for the lease to run out
    procs = [contenders(etcd_shared.endpoint, cluster, m, ttl) for m in ("a", "b")]
    leader, term = _wait_one_leader(procs, timeout=15)
    standby = next(c for c in procs if c is not leader)
    stopped_at = time.monotonic()
    # The resign is the first thing SIGTERM does; the exit after it (threads joined, etcd
    # connections closed) may take seconds on a loaded machine, and is not what is timed.
    assert leader.proc.stop(grace=20.0) == 0
    assert leader.records("closed")
    rec = standby.wait_leading(timeout=ttl, min_term=term + 1)
    assert float(rec["at"]) - stopped_at < 1.5


def test_the_election_resumes_after_etcd_restarts_on_the_same_data(
    etcd: EtcdServer, cluster: str, contenders: Any
) -> None:
    procs = [contenders(etcd.endpoint, cluster, m, TTL) for m in ("a", "b")]
    _, term = _wait_one_leader(procs, timeout=10)
    etcd.kill()
    etcd.start()
    # Leadership either survived the restart (same term) or passed on with a higher term; in
    # both cases exactly one leads again, and terms never went back.
    leader, after = _wait_one_leader(procs, timeout=3 * TTL + 5, min_term=term)
    assert after >= term
    # A few keepalives later it still leads (it really holds a lease on the restarted etcd).
    time.sleep(TTL)
    assert _one_leader(procs)[0] is leader


def test_a_leader_cut_off_from_etcd_steps_down_by_its_own_deadline_and_leadership_resumes(
    etcd: EtcdServer, cluster: str, contenders: Any
) -> None:
    procs = [contenders(etcd.endpoint, cluster, m, TTL) for m in ("a", "b")]
    leader, term = _wait_one_leader(procs, timeout=10)
    etcd.freeze()
    frozen_at = time.monotonic()
    # Two threads of the contender print these: the election's and the ticker's.
    wait_until(
        lambda: leader.records("deadline", frozen_at) and leader.records("leading", frozen_at),
        TTL + 2,
        what="the leader to step down",
    )
    stepped = float(leader.records("leading", frozen_at)[0]["at"])
    assert not leader.records("leading", frozen_at)[0]["rest"].startswith("1")
    # Local deadline: the last keepalive was sent at most TTL/3 before the freeze.
    assert stepped - frozen_at < TTL, stepped - frozen_at
    assert not any(c.leading()[0] for c in procs)
    etcd.thaw()
    _, after = _wait_one_leader(procs, timeout=3 * TTL + 5, min_term=term + 1)
    assert after > term


def test_in_process_election_resign_and_states(gateway: EtcdGateway, cluster: str) -> None:
    keys = ClusterKeys(cluster)
    config = ElectionConfig(lease=LeaseConfig(ttl=TTL), retry_interval=0.2)
    seen: list[tuple[str, Role, int]] = []
    elections = [
        Election(
            gateway,
            keys,
            m,
            f"127.0.0.1:{5000 + i}",
            config=config,
            on_change=lambda s, m=m: seen.append((m, s.role, s.term)),
        )
        for i, m in enumerate(("x", "y"))
    ]
    for e in elections:
        e.start()
    try:
        first = wait_until(
            lambda: next((e for e in elections if e.leading()), None), 10, what="a leader"
        )
        other = next(e for e in elections if e is not first)
        state = other.wait(lambda s: s.leader is not None, 5)
        assert state is not None and state.leader is not None
        assert state.role is Role.FOLLOWER and state.leader.member_id == first.member_id
        assert state.leader.address == first.address
        term = first.state.term
        first.close()
        assert first.state.role is Role.CLOSED and not first.leading()
        assert other.wait(lambda s: s.role is Role.LEADER, 5) is not None
        assert other.state.term == term + 1 and other.leading()
        assert first.last_deadline <= time.monotonic()
    finally:
        for e in elections:
            e.close()
    assert ("x", Role.CLOSED, 0) in seen and ("y", Role.CLOSED, 0) in seen


def test_member_ids_are_validated(gateway: EtcdGateway, cluster: str) -> None:
    with pytest.raises(ValueError, match="member id"):
        Election(gateway, ClusterKeys(cluster), "bad/id", "127.0.0.1:1")


def test_a_garbage_term_key_stalls_the_campaign_but_does_not_end_it(
    gateway: EtcdGateway, cluster: str
) -> None:
    keys = ClusterKeys(cluster)
    gateway.put(keys.term, b"not a number")
    config = ElectionConfig(lease=LeaseConfig(ttl=TTL), retry_interval=0.1)
    with Election(gateway, keys, "g", "127.0.0.1:1", config=config) as e:
        assert e.wait(lambda s: s.role is Role.LEADER, 0.5) is None  # refuses to guess a term
        gateway.put(keys.term, b"41")
        state = e.wait(lambda s: s.role is Role.LEADER, 5)
        assert state is not None and state.term == 42 and e.leading()
    assert gateway.get(keys.leader)[0] is None  # resigned on exit
