"""Fixtures of the kvpool.ha tests: a real etcd (Debian's etcd-server) on loopback ports.

`etcd_shared` is one server for the session (tests keep apart by cluster id: `cluster`);
`etcd` is a private one for tests that stop, freeze or restart it. Without the binary the tests
skip, or fail when KVPOOL_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtest.etcd import EtcdServer
from kvtest.procs import Proc, wait_until


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path / "etcd-data")
    try:
        server.start()
        yield server
    finally:
        server.stop()


CONTENDER = Path(__file__).with_name("contender.py")
_LINE = re.compile(r"^(\w+) ?(.*) at=([\d.]+)$")


class Contender:
    """One `contender.py` process (tests/ha/contender.py) and what it printed."""

    def __init__(self, endpoint: str, cluster: str, member: str, ttl: int) -> None:
        self.member = member
        self.proc = Proc(
            [
                sys.executable,
                str(CONTENDER),
                "--etcd",
                endpoint,
                "--cluster",
                cluster,
                "--id",
                member,
                "--ttl",
                str(ttl),
            ],
            name=f"contender-{member}",
        )
        self.proc.wait_for_line(r"^ready ", timeout=20)

    def records(self, kind: str, since: float = 0.0) -> list[dict[str, str]]:
        """Printed lines of `kind` stamped at or after `since`, as dicts (plus "at")."""
        out = []
        for line in list(self.proc.lines):
            m = _LINE.match(line)
            if not m or m.group(1) != kind or float(m.group(3)) < since:
                continue
            fields: dict[str, str] = {"at": m.group(3), "rest": m.group(2)}
            for part in m.group(2).split(" "):
                k, eq, v = part.partition("=")
                if eq:
                    fields.setdefault(k, v)
            out.append(fields)
        return out

    def leading(self) -> tuple[bool, int, float]:
        """(leading, term, since) from its last `leading` line."""
        recs = self.records("leading")
        if not recs:
            return False, 0, 0.0
        last = recs[-1]
        return last["rest"].startswith("1"), int(last.get("term", 0)), float(last["at"])

    def wait_leading(self, timeout: float, min_term: int = 0, since: float = 0.0) -> dict[str, str]:
        def found() -> dict[str, str] | None:
            for rec in self.records("leading", since):
                if rec["rest"].startswith("1") and int(rec["term"]) >= min_term:
                    return rec
            return None

        return wait_until(found, timeout, what=f"{self.member} to lead (term >= {min_term})")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.stop()


@pytest.fixture
def contenders() -> Iterator[Callable[..., Contender]]:
    """Start contenders: `start(endpoint, cluster, member, ttl=2)`; all stopped at the end."""
    started: list[Contender] = []

    def start(endpoint: str, cluster: str, member: str, ttl: int = 2) -> Contender:
        c = Contender(endpoint, cluster, member, ttl)
        started.append(c)
        return c

    try:
        yield start
    finally:
        for c in started:
            c.stop()
