"""Mooncake's REST store service on kvpool: the routes and answers of
`mooncake.mooncake_store_service`, against a live pool.

`StoreService.handle` is checked directly over a real compat store (every route, the error
answers); then the service runs as its own process, configured from MOONCAKE_* variables as
deployments configure it, and is used over HTTP.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvpool.compat.mooncake import MooncakeConfig
from kvpool.compat.mooncake_service import StoreService
from kvtest.procs import Proc


def _service(backend: Any) -> StoreService:
    if backend.name != "kvpool":
        pytest.skip("the service is kvpool's; the wheel's needs aiohttp and its own client")
    store = backend.store()
    config = MooncakeConfig("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", "x")
    return StoreService(store, config)


def _call(svc: StoreService, method: str, path: str, body: object = None) -> tuple[int, Any]:
    raw = b"" if body is None else json.dumps(body).encode()
    status, ctype, payload = svc.handle(method, path, raw)
    return status, json.loads(payload) if ctype == "application/json" else payload


def test_object_routes_answer_as_mooncakes(backend: Any) -> None:
    svc = _service(backend)
    assert _call(svc, "PUT", "/api/put", {"key": "a b", "value": "héllo"}) == (
        200,
        {"status": "success"},
    )
    assert _call(svc, "GET", "/api/get/a%20b") == (200, "héllo".encode())
    assert _call(svc, "GET", "/api/exist/a%20b") == (200, {"exists": True})
    assert _call(svc, "GET", "/api/exist/nope") == (200, {"exists": False})
    assert _call(svc, "GET", "/api/get/nope") == (404, {"error": "Key not found"})
    assert _call(svc, "PUT", "/api/put", {"key": "k"}) == (400, {"error": "Missing key or value"})
    # The get granted a lease: remove fails (500) as Mooncake's does, remove_all skips it.
    assert _call(svc, "DELETE", "/api/remove/a%20b") == (500, {"error": "Remove operation failed"})
    assert _call(svc, "PUT", "/api/put", {"key": "b", "value": "v"})[0] == 200
    assert _call(svc, "DELETE", "/api/remove_all") == (
        200,
        {"status": "success removed 1 keys"},
    )
    assert _call(svc, "DELETE", "/api/remove/nope") == (500, {"error": "Remove operation failed"})


def test_unknown_routes_and_bad_bodies(backend: Any) -> None:
    svc = _service(backend)
    assert svc.handle("GET", "/api/nothing", b"")[0] == 404
    assert svc.handle("POST", "/api/put", b"")[0] == 405
    assert svc.handle("GET", "/api/get/", b"")[0] == 404
    status, body = _call(svc, "PUT", "/api/put", ["not", "an", "object"])
    assert status == 500 and "JSON object" in body["error"]
    assert _call(svc, "POST", "/api/mount", {"size": -1}) == (
        400,
        {"error": "Invalid size, must be a positive integer"},
    )
    assert _call(svc, "POST", "/api/unmount", {}) == (400, {"error": "Missing segment_ids"})
    assert _call(svc, "POST", "/api/mount_shm", {"name": "../x", "size": 1})[0] == 400
    assert _call(svc, "POST", "/api/unmount_local_disk", {"grace_period_seconds": -1})[0] == 400
    assert svc.handle("POST", "/api/unmount_local_disk", b"{")[0] == 400
    assert _call(svc, "POST", "/api/unmount_local_disk", {}) == (200, {"status": "success"})
    assert _call(svc, "POST", "/api/reconfigure", {"mode": "x"}) == (
        400,
        {"error": "Invalid mode. Use 'decode' or 'prefill'"},
    )


def test_segment_routes_mount_and_unmount(backend: Any, tmp_path: Path) -> None:
    svc = _service(backend)
    status, body = _call(svc, "POST", "/api/mount", {"size": 1 << 20})
    assert status == 200 and body["status"] == "success" and body["allocated_size"] >= 1 << 20
    assert _call(svc, "POST", "/api/unmount", {"segment_ids": body["segment_ids"]}) == (
        200,
        {"status": "success"},
    )
    name = f"kvpool-test-svc-{os.getpid()}"
    shm = Path("/dev/shm") / name
    shm.write_bytes(bytes(1 << 20))
    try:
        status, body = _call(svc, "POST", "/api/mount_shm", {"name": name, "size": 1 << 20})
        assert status == 200 and len(body["segment_ids"]) == 1
        assert _call(svc, "POST", "/api/unmount_shm", {"segment_ids": body["segment_ids"]}) == (
            200,
            {"status": "success"},
        )
        status, body = _call(
            svc, "POST", "/api/reconfigure", {"mode": "decode", "path": str(shm), "size": 1 << 20}
        )
        assert status == 200 and body["mode"] == "decode" and len(body["segment_ids"]) == 1
        assert svc.mode == "decode"
        assert _call(svc, "POST", "/api/reconfigure", {"mode": "prefill"}) == (
            200,
            {"status": "success", "mode": "prefill"},
        )
        assert svc.mounted == []
    finally:
        shm.unlink()


def _http(base: str, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_service_process_serves_a_live_pool(backend: Any) -> None:
    if backend.name != "kvpool":
        pytest.skip("the service is kvpool's")
    env = {
        **os.environ,
        "MOONCAKE_MASTER": backend.master,
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": "16MB",
        "MOONCAKE_LOCAL_BUFFER_SIZE": "16MB",
        "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
    }
    env.pop("MOONCAKE_CONFIG_PATH", None)
    cmd = [sys.executable, "-m", "kvpool.compat.mooncake_service", "--port", "0"]
    with Proc([*cmd, "-Dprotocol=tcp", "--max-wait-time", "10"], env=env, name="svc") as svc:
        # Its own line: the store inside logs its transfer server's "listening on" too.
        m = svc.wait_for_line(r"mooncake_store_service listening on (\S+):(\d+)", timeout=30)
        base = f"http://{m.group(1)}:{m.group(2)}"
        assert _http(base, "PUT", "/api/put", {"key": "svc-k", "value": "v1"})[0] == 200
        assert _http(base, "GET", "/api/get/svc-k") == (200, b"v1")
        assert _http(base, "GET", "/api/exist/svc-k") == (200, b'{"exists": true}')
        assert _http(base, "GET", "/api/get/svc-missing")[0] == 404
        assert _http(base, "DELETE", "/api/remove_all")[0] == 200
        assert svc.stop() == 0
