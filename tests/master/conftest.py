"""Fixtures of the master tests: a hand-driven clock and a service with mounted segments."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvpool.master.config import MasterConfig
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m


class Clock:
    """A clock the test moves by hand (`advance`), so lease and TTL rules run without waiting."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


NODE = m.ClientId("node-1")
WRITER = m.ClientId("writer-1")
OTHER = m.ClientId("writer-2")
HOST = m.HostId("host-a")
MiB = 1 << 20


def mount(
    svc: MasterService,
    name: str,
    size: int = 16 * MiB,
    client: m.ClientId = NODE,
    host: m.HostId = HOST,
) -> None:
    info = m.SegmentInfo(m.SegmentName(name), size, host, f"127.0.0.1:{len(name)}", "")
    reply = svc.handle(m.MountSegment(client, host, info))
    assert isinstance(reply, m.Reply) and reply.code == 0, reply


MakeService = Callable[..., MasterService]


@pytest.fixture
def make_service(clock: Clock) -> MakeService:
    """`make_service(segments=2, **config)`: a service on the test clock, seeded placement.

    A client silent for `client_ttl` is dropped at once here (`client_dead_ttl` defaults to
    `client_ttl`), as these tests of the drop path expect; the tests of the silent state
    (tests/master/test_silent.py) give `client_dead_ttl` themselves."""

    def make(segments: int = 2, size: int = 16 * MiB, **cfg: object) -> MasterService:
        cfg.setdefault("seed", 7)
        cfg.setdefault("client_dead_ttl", cfg.get("client_ttl", 10.0))
        svc = MasterService(MasterConfig(**cfg), clock=clock)  # type: ignore[arg-type]
        for i in range(segments):
            mount(svc, f"seg-{i}", size)
        return svc

    return make


@pytest.fixture
def svc(make_service: MakeService) -> MasterService:
    return make_service()
