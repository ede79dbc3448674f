"""The admin HTTP API of a master with credentials (`--auth-file`): the JSON paths answer
admin tokens only (no token or an unknown one 401, a client or node token 403); `/metrics`,
`/health`, `/role` and the dashboard page stay open; the dashboard, given the token in its
URL's fragment, reads the pool (a real headless Chromium)."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvpool.protocol.messages import (
    ClientId,
    HostId,
    MountSegment,
    Response,
    SegmentInfo,
    SegmentName,
)
from kvpool.rpc.client import RpcClient
from kvtest.ops_http import http_base
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401
from kvtest.procs import require_binary

CLIENT = "client-token-0000000000000000000001"
NODE = "node-token-00000000000000000000000002"
ADMIN = "admin-token-0000000000000000000000003"

_GATED = (
    ("GET", "/query_key?key=k"),
    ("GET", "/get_all_segments"),
    ("GET", "/api/v1/segments/status"),
    ("GET", "/get_all_keys"),
    ("GET", "/api/v1/tenants"),
    ("GET", "/api/v1/stats"),
    ("GET", "/api/v1/segments/drain?segment=s"),
    ("POST", "/api/v1/segments/drain?segment=s"),
)


def _request(url: str, method: str = "GET", token: str | None = None) -> tuple[int, Any, Any]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, body, headers = r.status, r.read(), r.headers
    except urllib.error.HTTPError as exc:
        status, body, headers = exc.code, exc.read(), exc.headers
    if headers.get("Content-Type", "").startswith("application/json"):
        return status, json.loads(body), headers
    return status, body.decode(), headers


@pytest.fixture
def secured(pool: PoolFactory, tmp_path: Path) -> tuple[Pool, str]:  # noqa: F811
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        f"  - {{token: {CLIENT}, tenant: team-a, role: client}}\n"
        f"  - {{token: {NODE}, tenant: team-a, role: node}}\n"
        f"  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
    )
    p = pool(nodes=0, master_args=("--http-port", "0", "--auth-file", str(auth)))
    return p, http_base(p.master)


def test_admin_paths_need_an_admin_token(secured: tuple[Pool, str]) -> None:
    _, base = secured
    for method, path in _GATED:
        status, body, headers = _request(base + path, method)
        assert status == 401, (path, body)
        assert "Bearer" in headers["WWW-Authenticate"]
        assert "admin token" in body["error"]
        status, body, _ = _request(base + path, method, token="not-a-token-of-this-master-xx")
        assert status == 401, (path, body)
        for token, role in ((CLIENT, "client"), (NODE, "node")):
            status, body, _ = _request(base + path, method, token=token)
            assert status == 403, (path, role, body)
            assert f"this is a {role} token" in body["error"]
        status, body, _ = _request(base + path, method, token=ADMIN)
        # Past the gate: the endpoint's own answer (no such key, no such segment or drain).
        assert status in (200, 404), (path, body)
    status, body, _ = _request(base + "/api/v1/stats", token=ADMIN)
    assert status == 200 and body["objects"] == 0
    status, body, _ = _request(base + "/query_key?key=k", token=ADMIN)
    assert status == 404 and "no object" in body["error"]
    # A malformed header is a 401, never a 500.
    for bad in ("Basic abc", "Bearer", "Bearer    ", "bearer\t"):
        req = urllib.request.Request(base + "/api/v1/stats", headers={"Authorization": bad})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 401
        err.value.close()


def test_metrics_health_role_and_the_page_stay_open(secured: tuple[Pool, str]) -> None:
    _, base = secured
    status, text, _ = _request(base + "/metrics")
    assert status == 200 and "master_key_count" in text
    status, body, _ = _request(base + "/health")
    assert status == 200 and body["status"] == "ok"
    status, body, _ = _request(base + "/role")
    assert status == 200 and body["role"] == "single"
    status, html, _ = _request(base + "/dashboard")
    assert status == 200 and 'id="auth"' in html


def _browse(browser: str, url: str) -> str:
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=3000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    return proc.stdout


def test_dashboard_takes_the_admin_token(secured: tuple[Pool, str]) -> None:
    found = [shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")]
    browser = next((b for b in found if b), None) or require_binary("chromium")
    p, base = secured
    with RpcClient(p.address, response_type=Response, token=NODE.encode()) as rpc:
        info = SegmentInfo(SegmentName("seg-auth"), 1 << 20, HostId("h"), "127.0.0.1:1", "")
        reply = rpc.call(MountSegment(ClientId("node-auth"), HostId("h"), info))
        assert reply.code == 0, reply
        dom = _browse(browser, base + "/dashboard#token=" + ADMIN)
        assert 'class="segment"' in dom and "seg-auth" in dom, dom[-2000:]
        assert 'id="auth" class="shown"' not in dom
        dom = _browse(browser, base + "/dashboard")
        assert 'id="auth" class="shown"' in dom
        assert "an admin token is needed" in dom
