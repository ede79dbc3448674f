"""The open HTTP paths of a master with credentials name segments, and a segment's name is
its node's transfer endpoint plus a number (`f"{server.endpoint}/{n}"`, src/kvpool/client/node.py):
anyone who reaches the HTTP port learns every node's data-plane HOST:PORT without a token
(a review finding). That is by design (docs/parts/ops.md, "With credentials"): an endpoint is no
secret, because a transfer server with credentials serves nothing to a connection that does not
prove the pool's data key. This checks exactly that, with the endpoint read from `/metrics`.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from kvpool.transfer import TransferOp
from kvpool.transfer.proof import CHALLENGE, CHALLENGE_MAGIC
from kvpool.transfer.wire import REQ, REQ_MAGIC
from kvtest.ops_http import http_base
from kvtest.pool import PoolFactory, pool  # noqa: F401

NODE = "node-token-00000000000000000000000002"
ADMIN = "admin-token-0000000000000000000000003"


def test_an_endpoint_read_from_open_metrics_yields_no_byte_without_the_data_key(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        f"  - {{token: {NODE}, tenant: ops, role: node}}\n"
        f"  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
    )
    token = tmp_path / "node.token"
    token.write_text(NODE + "\n")
    p = pool(nodes=0, master_args=("--http-port", "0", "--auth-file", str(auth)))
    base = http_base(p.master)
    p.add_node("8MiB", "--token-file", str(token))
    endpoint = p.node_endpoints[-1]  # the node's transfer server (its ready line)
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "kvpool_segment_capacity_bytes" in text
    assert endpoint in text  # named, as documented
    host, port = endpoint.rsplit(":", 1)
    name = (endpoint + "/0").encode()
    # A raw READ of the segment in place of the proof: the server sends its challenge and
    # closes, with no answer header, code or byte of the segment.
    read = REQ.pack(REQ_MAGIC, int(TransferOp.READ), 0, len(name), 1, 0, 4096) + name
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(read * 2)
        got = b""
        while True:
            try:
                chunk = s.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
    assert len(got) == CHALLENGE.size and got.startswith(CHALLENGE_MAGIC), got[:64]
