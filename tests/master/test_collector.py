"""The master's collector setting: a started `MasterServer` runs with a gen-0 threshold of
10,000 (not Python's 700), the setting measured in docs/parts/perf-master.md ("The
collector"): less CPU per put and shorter worst pauses than the default."""

from __future__ import annotations

import gc

from kvpool.master.config import MasterConfig
from kvpool.master.server import MasterServer
from kvpool.protocol import messages as m
from kvpool.rpc import RpcClient, ServerThread


def test_a_started_master_raises_the_young_generation_threshold() -> None:
    saved = gc.get_threshold()
    gc.set_threshold(700, *saved[1:])
    try:
        server = MasterServer(MasterConfig(port=0), server_name="t")
        with ServerThread(server, name="master-gc") as thread:  # type: ignore[arg-type]
            with RpcClient(thread.endpoint, response_type=m.Response, timeout=10) as rpc:
                assert rpc.call(m.Echo(b"x")) == m.EchoReply(b"x")
            assert gc.get_threshold() == (10_000, *saved[1:])
    finally:
        gc.set_threshold(*saved)
