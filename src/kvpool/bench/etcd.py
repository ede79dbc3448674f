"""A private one-member etcd for benchmarks: Debian's `etcd` on 127.0.0.1 ephemeral ports.

`LocalEtcd` starts `etcd` (from PATH or /usr/sbin) with its client and peer URLs on loopback
ports and its data in a temporary directory it owns; `close()` stops it by its PID and removes
the directory. `find_etcd()` answers the binary or None, so a benchmark can leave out what
needs etcd and say why.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from kvpool.children import Child, free_port

__all__ = ["LocalEtcd", "find_etcd"]

_READY = r"ready to serve client requests"


def find_etcd() -> str | None:
    """The path of the etcd binary, or None when it is not installed."""
    found = shutil.which("etcd")
    if found is None and os.access("/usr/sbin/etcd", os.X_OK):
        found = "/usr/sbin/etcd"
    return found


class LocalEtcd:
    """One etcd member on 127.0.0.1; `endpoint` is "127.0.0.1:PORT" (its client URL)."""

    def __init__(self, binary: str, timeout: float = 30.0) -> None:
        self.dir = tempfile.mkdtemp(prefix="kvpool-bench-etcd-")
        self.client_port = free_port()
        peer_port = free_port()
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self.proc: Child | None = None
        try:
            self.proc = Child(
                [
                    binary,
                    "--name=bench",
                    f"--data-dir={self.dir}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=bench={peer}",
                    "--initial-cluster-state=new",
                ],
                name="etcd (bench)",
            )
            self.proc.wait_line(_READY, timeout)
        except BaseException:
            self.close()
            raise

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def close(self) -> None:
        """Stop etcd and remove its data (idempotent)."""
        if self.proc is not None:
            self.proc.stop(grace=5.0)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalEtcd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
