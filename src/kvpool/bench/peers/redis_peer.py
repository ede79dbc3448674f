"""Redis as a peer: the store many users would pick instead of a KV-cache pool.

The driver starts its own Debian `redis-server` on a free loopback port with no persistence
(`--save "" --appendonly no`), and talks to it from one redis-py client with the hiredis
parser, as a user would: `SET` / `GET` for single values, one `MSET` for a batch put and one
`MGET` for a batch get, each batch one round trip. (A pipeline of 64 `SET`s is also one round
trip, but redis-py builds a command object per key, which makes it several times slower than
one `MSET` for 64 small values, so the faster form is measured.) `reset` is `FLUSHALL SYNC`.

`RedisDriver("unix")` is the same over a Unix domain socket (`--unixsocket` in a private
temporary directory, TCP off): kvpool's Store talks to a master on its own host over a Unix
socket, so this row is the like-for-like Redis for that case.

Redis always returns a new `bytes` for a value (there is no read-into-buffer API), so a get
pays for that allocation and copy; that is part of what a user of Redis gets. Values are handed
to redis-py as `bytes` (the copy is timed): measured on 2026-11-30, a 16 MiB SET of a
memoryview ran at a third of the speed of a SET of the same bytes, copy included.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvpool.bench.peers.base import BenchError, Driver, Unavailable
from kvpool.children import Child, free_port
from kvpool.override import override

if TYPE_CHECKING:
    import redis

__all__ = ["RedisDriver", "find_redis_server"]

_INSTALL_SERVER = "apt-get install redis-server"
_INSTALL_CLIENT = "pip install 'kvpool[redis]'"


def find_redis_server() -> str | None:
    """Path of the redis-server binary (Debian puts it in /usr/bin, some images in /usr/sbin)."""
    found = shutil.which("redis-server")
    if found is not None:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/sbin/redis-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


class RedisDriver(Driver):
    system = "redis"
    path = "tcp"

    def __init__(self, path: str = "tcp") -> None:
        super().__init__()
        if path not in ("tcp", "unix"):
            raise ValueError(f"redis path must be tcp or unix, not {path!r}")
        self.path = path
        self._child: Child | None = None
        self._client: redis.Redis | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @override
    def setup(self, capacity: int) -> None:
        try:
            import redis
        except ImportError as exc:
            raise Unavailable(f"redis-py is not installed ({exc})", _INSTALL_CLIENT) from exc
        try:
            import hiredis  # noqa: F401  (redis-py picks its parser up when importable)
        except ImportError as exc:
            raise Unavailable(f"hiredis is not installed ({exc})", _INSTALL_CLIENT) from exc
        binary = find_redis_server()
        if binary is None:
            raise Unavailable("redis-server is not installed", _INSTALL_SERVER)
        if self.path == "unix":
            self._tmp = tempfile.TemporaryDirectory(prefix="kvpool-bench-redis-")
            sock = os.path.join(self._tmp.name, "redis.sock")
            listen = ["--port", "0", "--unixsocket", sock, "--unixsocketperm", "700"]
        else:
            port = free_port()
            listen = ["--bind", "127.0.0.1", "--port", str(port)]
        # maxmemory well above what the run stores, so Redis never evicts a value we read back.
        self._child = Child(
            [
                binary,
                *listen,
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
                "--maxmemory",
                str(4 * capacity),
                "--maxmemory-policy",
                "noeviction",
            ],
            name="redis-server",
        )
        self._child.wait_line(r"(?i)ready to accept connections", timeout=30)
        if self.path == "unix":
            self._client = redis.Redis(unix_socket_path=sock, socket_timeout=60)
        else:
            self._client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
        if not self._client.ping():
            raise BenchError("redis-server does not answer PING")

    @override
    def apis(self, op: str, batched: bool) -> tuple[str, ...]:
        # Chosen by measurement once (module docstring), so only these are offered.
        return (("MSET" if batched else "SET") if op == "put" else ("MGET" if batched else "GET"),)

    def _redis(self) -> redis.Redis:
        if self._client is None:
            raise BenchError("redis used before setup")
        return self._client

    @override
    def put(self, key: str, value: memoryview) -> None:
        if not self._redis().set(key, bytes(value)):
            raise BenchError(f"redis SET {key!r} failed")

    @override
    def get(self, key: str, out: memoryview) -> bytes:
        value = self._redis().get(key)
        if not isinstance(value, bytes):
            raise BenchError(f"redis GET {key!r}: missing")
        return value

    @override
    def batch_put(self, keys: Sequence[str], values: Sequence[memoryview]) -> None:
        mapping = {key: bytes(value) for key, value in zip(keys, values, strict=True)}
        if not self._redis().mset(mapping):
            raise BenchError("redis MSET failed")

    @override
    def batch_get(self, keys: Sequence[str], outs: Sequence[memoryview]) -> list[bytes]:
        values = self._redis().mget(keys)
        result: list[bytes] = []
        for key, value in zip(keys, values, strict=True):
            if not isinstance(value, bytes):
                raise BenchError(f"redis MGET {key!r}: missing")
            result.append(value)
        return result

    @override
    def reset(self) -> None:
        self._redis().flushall(asynchronous=False)

    @override
    def teardown(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._child is not None:
            self._child.stop()
            self._child = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
