"""The cost of control-plane authentication: lock-step Echo and connect + handshake, against an
in-process `MasterServer` without and with an auth file, on TCP and on the Unix socket.

    .venv/bin/python benchmarks/auth_cost.py [--rounds 5] [--calls 5000] [--connects 200]

Runs alternate (off, on, off, on) so that a shared machine's drift shows as the spread between
two runs of one case. Prints a table; asserts nothing (docs/parts/perf-rpc.md has a reading).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kvpool.master.config import MasterConfig
from kvpool.master.server import MasterServer
from kvpool.protocol import messages as m
from kvpool.rpc import RpcClient, ServerThread

TOKEN = b"bench-admin-token-0000000000000000"


def lock_step(
    endpoint: str, rounds: int, calls: int, connects: int, **client: Any
) -> tuple[float, float]:
    """(median lock-step Echo calls/s over `rounds` of `calls`, median µs to connect and
    handshake) of a master at `endpoint`, with RpcClient keywords `client` (a token, TLS)."""
    rates = []
    with RpcClient(endpoint, response_type=m.Response, **client) as c:
        for _ in range(calls // 2):
            c.call(m.Echo(b""))
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                c.call(m.Echo(b""))
            rates.append(calls / (time.perf_counter() - t0))
    times = []
    for _ in range(connects):
        t0 = time.perf_counter()
        with RpcClient(endpoint, response_type=m.Response, **client) as c:
            c.connect()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(rates), statistics.median(times)


def run(auth_file: str, unix: bool, rounds: int, calls: int, connects: int) -> str:
    os.environ["KVPOOL_RPC_UNIX"] = "1" if unix else "0"
    st = ServerThread(MasterServer(MasterConfig(port=0, auth_file=auth_file))).start()
    token = TOKEN if auth_file else None
    try:
        rate, connect = lock_step(st.endpoint, rounds, calls, connects, token=token)
    finally:
        st.stop()
    return (
        f"| {'Unix' if unix else 'TCP'} | {'yes' if auth_file else 'no'} | "
        f"{rate / 1000:.1f}k calls/s | {connect:.0f} µs |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--connects", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        auth = Path(tmp) / "auth.yaml"
        auth.write_text(f"tokens:\n  - {{token: {TOKEN.decode()}, tenant: t, role: admin}}\n")
        print("| transport | auth file | Echo lock-step | connect + handshake p50 |")
        print("|---|---|---|---|")
        for unix in (False, True):
            for path in ("", str(auth), "", str(auth)):
                print(run(path, unix, args.rounds, args.calls, args.connects), flush=True)


if __name__ == "__main__":
    main()
