"""Review finding on the open HTTP paths of a master with credentials
(src/kvpool/ops/admin.py module docstring, docs/parts/ops.md "With credentials").

The docs say `/metrics`, `/health` and `/role` stay open because they reveal "no key, client id,
endpoint, tenant name or token". But a segment's name is its node's transfer endpoint plus a
number (`f"{server.endpoint}/{n}"`, src/kvpool/client/node.py), and `/metrics` labels every
`kvpool_segment_*` series with it: anyone who reaches the HTTP port learns every node's
data-plane HOST:PORT without a token. (`/role` likewise names the HA leader's HOST:PORT.)
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from kvtest.pool import PoolFactory, pool  # noqa: F401

NODE = "node-token-00000000000000000000000002"
ADMIN = "admin-token-0000000000000000000000003"


@pytest.mark.xfail(
    strict=True,
    reason="review: /metrics (open with --auth-file) labels series with segment names, which "
    "are the nodes' transfer endpoints (ops/admin.py docstring says no endpoint)",
)
def test_open_metrics_name_no_endpoint(pool: PoolFactory, tmp_path: Path) -> None:  # noqa: F811
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        f"  - {{token: {NODE}, tenant: ops, role: node}}\n"
        f"  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
    )
    token = tmp_path / "node.token"
    token.write_text(NODE + "\n")
    p = pool(nodes=0, master_args=("--http-port", "0", "--auth-file", str(auth)))
    m = p.master.wait_for_line(r"http listening on (\S+):(\d+)")
    p.add_node("8MiB", "--token-file", str(token))
    endpoint = p.node_endpoints[-1]  # the node's transfer server (its ready line)
    with urllib.request.urlopen(f"http://{m.group(1)}:{m.group(2)}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "kvpool_segment_capacity_bytes" in text
    assert endpoint not in text, f"/metrics names {endpoint} without a token"
