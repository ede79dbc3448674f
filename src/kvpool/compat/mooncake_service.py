"""Mooncake's store service (`python -m mooncake.mooncake_store_service`) on kvpool.

Mooncake ships a small REST service around one `MooncakeDistributedStore`: configured from a
JSON file (`--config`) or the `MOONCAKE_*` variables (`MooncakeConfig`), overridden by
`-Dname=value`, it joins the pool (retrying for `--max-wait-time` seconds) and serves on
`--port` (8080):

    PUT    /api/put                {"key", "value"}        value stored as UTF-8 bytes
    GET    /api/get/{key}          the bytes (octet-stream), 404 when missing
    GET    /api/exist/{key}        {"exists": bool}
    DELETE /api/remove/{key}       {"status": "success"}
    DELETE /api/remove_all         {"status": "success removed N keys"}
    POST   /api/mount              {"size", "protocol"?, "location"?}    allocate_and_mount
    POST   /api/unmount            {"segment_ids", "grace_period_seconds"?}  unmount_and_free
    POST   /api/mount_shm          {"name", "size", "offset"?, ...}      a /dev/shm file
    POST   /api/unmount_shm        {"segment_ids", "grace_period_seconds"?}
    POST   /api/unmount_local_disk {"grace_period_seconds"?}
    POST   /api/reconfigure        {"mode": "decode", "path", "size", ...} | {"mode": "prefill"}

This module answers the same routes with the same status codes and JSON bodies, over
`kvpool.compat.mooncake` and the standard library's threading HTTP server (no aiohttp). One
difference on purpose: it binds 127.0.0.1 unless `--host` says otherwise (Mooncake binds
0.0.0.0); it prints `listening on HOST:PORT` once it serves, as kvpool's servers do.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from kvpool.compat.mooncake.config import MooncakeConfig
from kvpool.compat.mooncake.store import MooncakeDistributedStore

__all__ = ["Reply", "StoreService", "main"]

log = logging.getLogger("mooncake_store_service")

MAX_BODY = 100 << 20
"""Largest request body (Mooncake's aiohttp `client_max_size`, 100 MiB)."""
MAX_LOCAL_DISK_GRACE_S = 3600

Reply = tuple[int, str, bytes]
"""(HTTP status, content type, body)."""


def _json(status: int, body: object) -> Reply:
    return status, "application/json", json.dumps(body).encode()


def _error(status: int, message: str, **extra: object) -> Reply:
    return _json(status, {"error": message, **extra})


def _shm_path(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return None
    bare = name.removeprefix("/")
    if not bare or "/" in bare or bare in (".", ".."):
        return None
    return f"/dev/shm/{bare}"


def _ids(data: dict[str, Any]) -> list[str]:
    ids = data.get("segment_ids", [])
    return [ids] if isinstance(ids, str) else list(ids or [])


class StoreService:
    """The routes above over one store (a `MooncakeDistributedStore` that is set up).

    `handle` is the whole service: the HTTP layer only reads the request and writes the reply,
    so tests may call it directly. Thread-safe: the store is, and mount state changes are
    serialised by a lock."""

    def __init__(self, store: Any, config: MooncakeConfig) -> None:
        self.store = store
        self.config = config
        self.mode = "prefill"
        self.mounted: list[str] = []
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, str], Callable[[str, bytes], Reply]] = {
            ("PUT", "/api/put"): self._put,
            ("GET", "/api/get/"): self._get,
            ("GET", "/api/exist/"): self._exist,
            ("DELETE", "/api/remove/"): self._remove,
            ("DELETE", "/api/remove_all"): self._remove_all,
            ("POST", "/api/mount"): self._mount,
            ("POST", "/api/unmount"): self._unmount,
            ("POST", "/api/mount_shm"): self._mount_shm,
            ("POST", "/api/unmount_shm"): self._unmount_shm,
            ("POST", "/api/unmount_local_disk"): self._unmount_local_disk,
            ("POST", "/api/reconfigure"): self._reconfigure,
        }

    def handle(self, method: str, path: str, body: bytes) -> Reply:
        """The reply to one request (`path` without the query string, still %-encoded)."""
        route = self._routes.get((method, path))
        arg = ""
        if route is None:
            for (m, prefix), fn in self._routes.items():
                if m == method and prefix.endswith("/") and path.startswith(prefix):
                    rest = path[len(prefix) :]
                    if rest and "/" not in rest:
                        route, arg = fn, unquote(rest)
                        break
        if route is None:
            known = any(
                p == path or (p.endswith("/") and path.startswith(p)) for _, p in self._routes
            )
            if known:
                return 405, "text/plain", b"405: Method Not Allowed"
            return 404, "text/plain", b"404: Not Found"
        started = time.perf_counter()
        try:
            return route(arg, body)
        except Exception as exc:  # each Mooncake handler answers 500 with the message
            log.error("%s %s: %s", method, path, exc)
            return _error(500, str(exc))
        finally:
            log.info("%s %s in %.2f ms", method, path, (time.perf_counter() - started) * 1e3)

    @staticmethod
    def _body(body: bytes) -> dict[str, Any]:
        data = json.loads(body or b"null")
        if not isinstance(data, dict):
            raise ValueError("request body must be a JSON object")
        return data

    # ------------------------------------------------------------------ objects

    def _put(self, _: str, body: bytes) -> Reply:
        data = self._body(body)
        key, value = data.get("key"), data.get("value")
        if not key or value is None:
            return _error(400, "Missing key or value")
        if self.store.put(key, str(value).encode()) != 0:
            return _error(500, "PUT operation failed")
        return _json(200, {"status": "success"})

    def _get(self, key: str, _: bytes) -> Reply:
        exists = self.store.is_exist(key)
        if exists == 0:
            return _error(404, "Key not found")
        if exists < 0:
            return _error(500, "Exist check failed")
        value = self.store.get(key)
        if value == b"":
            exists = self.store.is_exist(key)  # removed meanwhile, or a failed read
            if exists == 0:
                return _error(404, "Key not found")
            if exists < 0:
                return _error(500, "Exist check failed")
        return 200, "application/octet-stream", bytes(value)

    def _exist(self, key: str, _: bytes) -> Reply:
        exists = self.store.is_exist(key)
        if exists < 0:
            return _error(500, "Exist check failed")
        return _json(200, {"exists": exists > 0})

    def _remove(self, key: str, _: bytes) -> Reply:
        if self.store.remove(key) != 0:
            return _error(500, "Remove operation failed")
        return _json(200, {"status": "success"})

    def _remove_all(self, _: str, __: bytes) -> Reply:
        n = self.store.remove_all()
        if n < 0:
            return _error(500, "RemoveAll operation failed")
        return _json(200, {"status": f"success removed {n} keys"})

    # ------------------------------------------------------------------ segments

    def _mount(self, _: str, body: bytes) -> Reply:
        data = self._body(body)
        size = data.get("size")
        if type(size) is not int or size <= 0:
            return _error(400, "Invalid size, must be a positive integer")
        protocol = data.get("protocol", self.config.protocol)
        result = self.store.allocate_and_mount_segment(size, protocol, data.get("location", ""))
        if result["ret"] != 0:
            return _error(500, f"Allocate and mount failed, ret={result['ret']}")
        return _json(
            200,
            {
                "status": "success",
                "segment_ids": list(result["segment_ids"]),
                "allocated_size": result["allocated_size"],
            },
        )

    def _unmount(self, _: str, body: bytes) -> Reply:
        data = self._body(body)
        ids = _ids(data)
        if not ids:
            return _error(400, "Missing segment_ids")
        ret = self.store.unmount_and_free_segment(ids, data.get("grace_period_seconds", 0))
        if ret != 0:
            return _error(500, f"Unmount and free failed, ret={ret}")
        return _json(200, {"status": "success"})

    def _mount_shm(self, _: str, body: bytes) -> Reply:
        data = self._body(body)
        path, size = _shm_path(data.get("name")), data.get("size")
        if not path or size is None:
            return _error(400, "Missing or invalid name or size")
        result = self.store.mount_segment(
            path,
            size,
            data.get("offset", 0),
            data.get("protocol", self.config.protocol),
            data.get("location", ""),
        )
        if result["ret"] != 0:
            return _error(500, f"Mount failed, ret={result['ret']}")
        return _json(200, {"status": "success", "segment_ids": list(result["segment_ids"])})

    def _unmount_shm(self, _: str, body: bytes) -> Reply:
        data = self._body(body)
        ids = _ids(data)
        if not ids:
            return _error(400, "Missing segment_ids")
        grace = data.get("grace_period_seconds", 0)
        failed = []
        with self._lock:
            for sid in ids:
                if self.store.unmount_segment([sid], grace) != 0:
                    failed.append(sid)
                elif sid in self.mounted:
                    self.mounted.remove(sid)
            if not self.mounted:
                self.mode = "prefill"
        if failed:
            return _error(500, "Unmount failed for one or more segments", failed_segment_ids=failed)
        return _json(200, {"status": "success"})

    def _unmount_local_disk(self, _: str, body: bytes) -> Reply:
        try:
            data = self._body(body)
        except ValueError:
            return _error(400, "Malformed JSON body")
        grace = data.get("grace_period_seconds", 0)
        if type(grace) is not int or not 0 <= grace <= MAX_LOCAL_DISK_GRACE_S:
            return _error(
                400,
                "Invalid grace_period_seconds, must be a non-negative integer no greater "
                f"than {MAX_LOCAL_DISK_GRACE_S}",
            )
        ret = self.store.unmount_local_disk_segment(grace)
        if ret != 0:
            return _error(500, f"Unmount local disk failed, ret={ret}")
        return _json(200, {"status": "success"})

    def _reconfigure(self, _: str, body: bytes) -> Reply:
        data = self._body(body)
        mode = str(data.get("mode", "")).lower()
        if mode == "decode":
            return self._to_decode(data)
        if mode == "prefill":
            with self._lock:
                if self.mounted:
                    ret = self.store.unmount_segment(self.mounted)
                    if ret != 0:
                        return _error(500, f"Unmount failed, ret={ret}")
                    self.mounted.clear()
                self.mode = "prefill"
            return _json(200, {"status": "success", "mode": self.mode})
        return _error(400, "Invalid mode. Use 'decode' or 'prefill'")

    def _to_decode(self, data: dict[str, Any]) -> Reply:
        path, size = data.get("path"), data.get("size")
        if not path or size is None:
            return _error(400, "Missing path or size for decode mode")
        with self._lock:
            # Make before break: the new segment is mounted first, the previous ones are
            # unmounted only once it serves (a failed mount keeps them).
            previous = list(self.mounted)
            result = self.store.mount_segment(
                path,
                size,
                data.get("offset", 0),
                data.get("protocol", self.config.protocol),
                data.get("location", ""),
            )
            if result["ret"] != 0:
                if previous:
                    return _error(
                        500,
                        f"Mount failed, ret={result['ret']}; keeping previous decode segments",
                        mode=self.mode,
                    )
                self.mode = "prefill"
                self.mounted.clear()
                return _error(
                    500,
                    f"Mount failed, ret={result['ret']}; rolled back to prefill",
                    mode=self.mode,
                )
            failed = [sid for sid in previous if self.store.unmount_segment([sid]) != 0]
            self.mounted = list(result["segment_ids"]) + failed
            self.mode = "decode"
            return _json(200, {"status": "success", "mode": self.mode, "segment_ids": self.mounted})


def _handler_class(service: StoreService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                reply: Reply = _error(413, f"request body over {MAX_BODY} bytes")
                self.close_connection = True
            else:
                body = self.rfile.read(length) if length > 0 else b""
                reply = service.handle(self.command, self.path.split("?", 1)[0], body)
            status, ctype, payload = reply
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_DELETE = _serve  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return Handler


def _config(path: str | None, defines: Sequence[str]) -> MooncakeConfig:
    config = MooncakeConfig.from_file(path) if path else MooncakeConfig.load_from_env()
    for item in defines:
        key, eq, value = item.partition("=")
        if not eq:
            log.warning("Ignoring invalid CLI config: %s", item)
        elif hasattr(config, key):
            setattr(config, key, value)
    return config


def _setup(config: MooncakeConfig, max_wait: float, stop: threading.Event) -> Any:
    """A set-up store, retrying once a second for `max_wait` seconds (as Mooncake's service);
    None when it gives up or is stopped."""
    deadline = time.monotonic() + max_wait
    attempt = 0
    while not stop.is_set():
        attempt += 1
        store = MooncakeDistributedStore()
        rc = store.setup(
            {
                "local_hostname": config.local_hostname,
                "metadata_server": config.metadata_server,
                "global_segment_size": config.global_segment_size,
                "local_buffer_size": config.local_buffer_size,
                "protocol": config.protocol,
                "rdma_devices": config.device_name or "",
                "master_server_addr": config.master_server_address,
                "enable_ssd_offload": config.enable_ssd_offload,
                "ssd_offload_path": config.ssd_offload_path,
                "tenant_id": config.tenant_id,
                "enable_client_http_server": config.enable_client_http_server,
                "client_http_port": config.client_http_port,
            }
        )
        if rc == 0:
            return store
        left = deadline - time.monotonic()
        log.warning("store setup failed (attempt %d, code %d); %.1f s left", attempt, rc, left)
        if left <= 0 or stop.wait(min(1.0, left)):
            break
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mooncake.mooncake_store_service` (and Mooncake's `mc_store_rest_server`)."""
    parser = argparse.ArgumentParser(description="Mooncake Store Service with REST API (kvpool)")
    parser.add_argument("--config", help="Path to a Mooncake config file (JSON)")
    parser.add_argument(
        "-D", "--define", action="append", default=[], help="Override a config field: -Dkey=value"
    )
    parser.add_argument("--port", type=int, default=8080, help="HTTP API port (default: 8080)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="Address to bind (kvpool: loopback by default)"
    )
    parser.add_argument(
        "--max-wait-time", type=float, default=60, help="Seconds to keep retrying setup"
    )
    args = parser.parse_args(None if argv is None else list(argv))
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        config = _config(args.config, args.define)
    except (ValueError, OSError) as exc:
        log.error("Configuration load failed: %s", exc)
        return 1
    store = _setup(config, args.max_wait_time, stop)
    if store is None:
        if stop.is_set():
            return 0
        log.error("Failed to start store service")
        return 1
    server = None
    try:
        server = ThreadingHTTPServer(
            (args.host, args.port), _handler_class(StoreService(store, config))
        )
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="store-service", daemon=True)
        thread.start()
        host, port = str(server.server_address[0]), int(server.server_address[1])
        sys.stdout.write(f"mooncake_store_service listening on {host}:{port}\n")
        sys.stdout.flush()
        log.info("REST API started on port %d", port)
        stop.wait()
        return 0
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", args.host, args.port, exc)
        return 1
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        store.close()


if __name__ == "__main__":
    sys.exit(main())
