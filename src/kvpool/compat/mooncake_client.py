"""`mooncake_client` on kvpool: the per-host standalone client that dummy clients attach to.

::

    mooncake_client --master_server_address=127.0.0.1:50051 --port=50052 --global_segment_size=4GB

contributes `--global_segment_size` bytes of this host's memory to the pool at
`--master_server_address` (a kvpool `Store` with that segment: served to same-host processes as
shared memory, to other hosts over TCP) and serves the attach protocol of
`kvpool.compat.mooncake.dummy` on the abstract Unix socket `@mooncake_client_<port>.sock` and
on TCP `--host:--port` (127.0.0.1 unless told otherwise; Mooncake binds 0.0.0.0). Engine
processes call `store.setup_dummy(mem_pool_size, local_buffer_size, "127.0.0.1:<port>")`.

Flags are Mooncake's (gflags syntax, `kvpool.compat.mooncake_flags`); it logs each dummy that
attaches and each that goes away (connection closed, or silent for
`kvpool.compat.mooncake.dummy.SILENT_AFTER` s), prints `mooncake_client listening on HOST:PORT`
once it serves, and on SIGINT / SIGTERM unmounts its segment and exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence

from kvpool.client import Store
from kvpool.compat.mooncake.config import parse_mooncake_size
from kvpool.compat.mooncake.dummy import (
    SILENT_AFTER,
    read_message,
    unix_name,
    write_message,
)
from kvpool.compat.mooncake.setup import pool_master_address
from kvpool.compat.mooncake_flags import Flag, FlagType, Support, parse_argv
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["CLIENT_FLAGS", "StandaloneClient", "main"]

log = logging.getLogger("mooncake_client")

MAX_DUMMIES = 1024
_S, _B, _I = FlagType.STRING, FlagType.BOOL, FlagType.INT
_MAP, _NOOP, _UNSUP = Support.MAPPED, Support.NOOP, Support.UNSUPPORTED

CLIENT_FLAGS: dict[str, Flag] = {
    f.name: f
    for f in (
        Flag("host", _S, "0.0.0.0", _MAP, "TCP address of the attach service (kvpool: 127.0.0.1)"),
        Flag("port", FlagType.PORT, "50052", _MAP, "attach service port (TCP and Unix socket)"),
        Flag("master_server_address", _S, "127.0.0.1:50051", _MAP, "the pool's master"),
        Flag("global_segment_size", _S, "4 GB", _MAP, "memory contributed (Mooncake's units)"),
        Flag("local_buffer_size", _S, "0", _NOOP, "dummies bring their own"),
        Flag("tenant_id", _S, "default", _MAP, "the tenant dummies use"),
        Flag("metadata_server", _S, "http://127.0.0.1:8080/metadata", _NOOP, "not needed"),
        Flag("protocol", _S, "tcp", _NOOP, "kvpool picks shm or TCP itself"),
        Flag("device_names", _S, "", _NOOP, "no RDMA devices"),
        Flag("threads", _I, "1", _NOOP, "one thread per attached dummy"),
        Flag("enable_offload", _B, "false", _UNSUP, "no SSD offload tier"),
        Flag("start_offload_rpc_server", _B, "true", _NOOP, "no SSD offload tier"),
        Flag("enable_http_server", _B, "false", _UNSUP, "no client HTTP server"),
        Flag("http_port", _I, "9300", _NOOP, "no client HTTP server"),
        Flag("v", _I, "0", _MAP, "log verbosity"),
        Flag("logtostderr", _B, "false", _NOOP, "kvpool logs to stderr"),
    )
}


class StandaloneClient:
    """A segment contributed to the pool, and the attach service dummies use (module
    docstring). `close()` is idempotent."""

    def __init__(
        self,
        master: str,
        segment_size: int,
        *,
        host: str,
        port: int,
        tenant: str = "default",
        token_file: str = "",
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
    ) -> None:
        self.master = master
        self.tenant = tenant
        # The pool's credentials and TLS (docs/security.md) are this process's; the dummies
        # attached to it act with them.
        self.store = Store(
            pool_master_address(master),
            segment_size=segment_size,
            host="127.0.0.1",
            tenant=tenant,
            token_file=token_file,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._dummies: dict[int, int] = {}  # connection id -> the dummy's pid
        self._next_id = 0
        self._listeners: list[socket.socket] = []
        self._conns: set[socket.socket] = set()
        try:
            tcp = socket.create_server((host, port), reuse_port=False)
            self._listeners.append(tcp)
            self.host, self.port = host, int(tcp.getsockname()[1])
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                unix.bind(unix_name(self.port))
                unix.listen(128)
                self._listeners.append(unix)
            except OSError as exc:  # another service holds the name: TCP only
                unix.close()
                log.warning("no Unix socket %r: %s", unix_name(self.port)[1:], exc)
        except BaseException:
            self.close()
            raise
        segments = self.store.segments
        self.hostname = segments[0].rsplit("/", 1)[0] if segments else f"127.0.0.1:{self.port}"
        for listener in self._listeners:
            threading.Thread(
                target=self._accept, args=(listener,), name="mooncake-client-accept", daemon=True
            ).start()

    @property
    def dummies(self) -> int:
        """Dummy clients attached now."""
        with self._lock:
            return len(self._dummies)

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                full = len(self._conns) >= MAX_DUMMIES or self._closed.is_set()
                if not full:
                    self._conns.add(conn)
            if full:
                conn.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="mooncake-client-dummy", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        conn_id, pid = -1, 0
        try:
            conn.settimeout(SILENT_AFTER)
            reader = conn.makefile("rb")
            while not self._closed.is_set():
                msg = read_message(reader)
                op = msg.get("op")
                if op == "attach" and conn_id < 0:
                    pid = int(msg.get("pid", 0))  # type: ignore[call-overload]
                    with self._lock:
                        conn_id, self._next_id = self._next_id, self._next_id + 1
                        self._dummies[conn_id] = pid
                        n = len(self._dummies)
                    log.warning("dummy client pid %d attached (%d attached)", pid, n)
                    write_message(
                        conn,
                        {
                            "ok": True,
                            "version": 1,
                            "master": self.master,
                            "tenant": self.tenant,
                            "hostname": self.hostname,
                        },
                    )
                elif op == "ping" and conn_id >= 0:
                    write_message(conn, {"ok": True})
                else:
                    write_message(conn, {"ok": False, "error": f"unexpected {op!r}"})
                    return
        except (OSError, EOFError, ValueError, TypeError):
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            if conn_id >= 0:
                with self._lock:
                    self._dummies.pop(conn_id, None)
                    n = len(self._dummies)
                # Its objects and leases are the master's to expire; nothing of it lives here.
                log.warning("dummy client pid %d detached (%d attached)", pid, n)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            socks = [*self._listeners, *self._conns]
        for sock in socks:
            # shutdown() wakes a thread blocked in accept() or recv() on it; close() alone
            # does not on Linux.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.store.close()


def main(argv: Sequence[str] | None = None) -> int:
    """The `mooncake_client` console script."""
    args = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    try:
        parsed = parse_argv(args, table=CLIENT_FLAGS, prog="mooncake_client")
        if parsed.help:
            for f in CLIENT_FLAGS.values():
                sys.stdout.write(f"  --{f.name} (default {f.default!r}): {f.kvpool}\n")
            return 0
        values = parsed.values

        def get(name: str) -> str:
            return values.get(name, CLIENT_FLAGS[name].default)

        for name, text in values.items():
            flag = CLIENT_FLAGS[name]
            if flag.support is Support.UNSUPPORTED and text != flag.default:
                log.warning("--%s=%s is ignored: %s", name, text, flag.kvpool)
        if int(get("v")) > 0:
            logging.getLogger().setLevel(logging.INFO)
        size = parse_mooncake_size(get("global_segment_size"), name="--global_segment_size")
        host = values.get("host", "127.0.0.1")
        if "host" not in values:
            log.warning("binding 127.0.0.1 (Mooncake binds 0.0.0.0); --host=0.0.0.0 for others")
    except InvalidParams as exc:
        sys.stderr.write(f"mooncake_client: {exc.message}\n")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        client = StandaloneClient(
            get("master_server_address"),
            size,
            host=host,
            port=int(get("port")),
            tenant=get("tenant_id"),
        )
    except (KVPoolError, OSError) as exc:
        sys.stderr.write(f"mooncake_client: {exc}\n")
        return 1
    try:
        sys.stdout.write(f"mooncake_client listening on {client.host}:{client.port}\n")
        sys.stdout.flush()
        log.info("serving %s (pid %d)", client.hostname, os.getpid())
        stop.wait()
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
