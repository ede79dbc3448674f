"""Review finding on the ops HTTP server (src/kvpool/ops/http.py, `HttpServer._one`).

The request head is read under `_HEAD_TIMEOUT` (10 s), but the body is read with
`await reader.readexactly(length)` and no deadline, before routing and before the admin-token
gate (`kvpool.ops.admin.MasterHttp._admin`). A peer that sends a head announcing a body and
then nothing holds its connection for ever; `MAX_CONNECTIONS` (64) such peers, needing no
token, make every later request, `/health` and `/metrics` included, answer 503 for as long as
they stay connected: liveness probes and Prometheus scrapes fail.
"""

from __future__ import annotations

import contextlib
import socket
import urllib.error
import urllib.request

from kvpool.ops.http import MAX_CONNECTIONS
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until

# The head's own deadline (ops/http.py `_HEAD_TIMEOUT`) plus some room: a fixed server frees
# the stalled connections by then.
_BOUND_S = 14.0


def _health(base: str) -> int:
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except OSError:
        return 0


def test_a_stalled_body_does_not_hold_the_http_port(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=0, master_args=("--http-port", "0"))
    m = p.master.wait_for_line(r"http listening on (\S+):(\d+)")
    host, port = m.group(1), int(m.group(2))
    base = f"http://{host}:{port}"
    assert _health(base) == 200
    socks: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            s = socket.create_connection((host, port), timeout=5)
            socks.append(s)
            s.sendall(
                b"POST /api/v1/segments/drain?segment=s HTTP/1.1\r\n"
                b"Host: x\r\nContent-Length: 100\r\n\r\n"
            )
        wait_until(lambda: _health(base) == 503, timeout=10, what="the port to be full")
        # The stalled peers are still connected: a server with a body deadline has dropped
        # them (and answers again) by now.
        wait_until(
            lambda: _health(base) == 200,
            timeout=_BOUND_S,
            interval=0.5,
            what="/health to answer 200 while 64 peers stall in their bodies",
        )
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
