"""A master stand-in for the election tests: campaigns in its own process and prints its state.

    python tests/ha/contender.py --etcd HOST:PORT --cluster C --id a [--ttl 2]

Lines (flushed), every one stamped with `time.monotonic()` (CLOCK_MONOTONIC is one clock for
every process of the machine, so the tests compare stamps across contenders):

    ready at=T
    state ROLE term=N leader=ID at=T reason=...     on every change (kvpool.ha.election)
    leading 1 term=N at=T / leading 0 at=T          when Election.leading() flips (polled)
    deadline D at=T                                 after losing a leadership: its last deadline

SIGTERM resigns (Election.close) and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
import zlib

from kvpool.ha import ClusterKeys, Election, ElectionConfig, ElectionState, EtcdGateway
from kvpool.ha.lease import LeaseConfig


def say(line: str) -> None:
    sys.stdout.write(f"{line} at={time.monotonic():.6f}\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--etcd", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--ttl", type=int, default=2)
    parser.add_argument("--request-timeout", type=float, default=0.5)
    args = parser.parse_args()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    gateway = EtcdGateway(args.etcd.split(","), timeout=1.0)
    election: Election | None = None

    def on_change(state: ElectionState) -> None:
        leader = state.leader.member_id if state.leader else "-"
        say(f"state {state.role.value} term={state.term} leader={leader} reason={state.reason}")
        if state.reason.startswith("lost leadership") and election is not None:
            say(f"deadline {election.last_deadline:.6f}")

    config = ElectionConfig(
        lease=LeaseConfig(ttl=args.ttl, request_timeout=args.request_timeout),
        resync_interval=2.0,
        retry_interval=0.2,
    )
    election = Election(
        gateway,
        ClusterKeys(args.cluster),
        args.id,
        f"127.0.0.1:{10000 + zlib.crc32(args.id.encode()) % 50000}",
        config=config,
        on_change=on_change,
    )
    election.start()
    say("ready")
    leading = False
    while not stop.wait(0.005):
        now = election.leading()
        if now != leading:
            leading = now
            say(f"leading 1 term={election.state.term}" if now else "leading 0")
    election.close()
    if leading:
        say("leading 0")
    gateway.close()
    say("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
