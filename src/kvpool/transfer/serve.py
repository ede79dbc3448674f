"""`python -m kvpool.transfer.serve`: one process that owns a segment and serves it over TCP.

The peer process of the transfer benchmark and of the tests (a real second process, with its
own address space). It prints, flushed, one line

    listening on HOST:PORT segment NAME size BYTES shm_path PATH host_id ID [raw HOST:PORT]

and runs until SIGTERM/SIGINT, or until stdin reaches EOF with `--watch-stdin` (so it dies with
a parent that spawned it with a pipe). With `--disk-dir DIR` the segment is a disk tier's data
file instead of a memfd: `DIR/kvpool-disk.data` of `--size` bytes (created, and filled with
`--fill`), mapped unpopulated and advertised as a disk tier mounts it (`kvpool.client.disk`),
so its READs are served as a node serves its disk tier (`sendfile`, `kvpool.transfer.serving`). `--raw` also serves the physical baseline of the
benchmark: a bare socket that answers "R n" by `sendall` of n bytes from a pre-faulted buffer
and "W n" by `recv_into` n bytes then one byte back.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import struct
import sys
import threading

from kvpool.config import parse_size
from kvpool.transfer.hostid import host_id
from kvpool.transfer.memory import DISK_FILE_NAME, SegmentMemory
from kvpool.transfer.server import TransferServer

__all__ = ["main"]

RAW_CMD = struct.Struct("<cQ")


def _serve_raw(listener: socket.socket, buf: memoryview) -> None:
    """Physical baseline: lock-step sendall / recv_into on one loopback socket per client."""
    threads: list[threading.Thread] = []
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            break
        t = threading.Thread(target=_raw_conn, args=(conn, buf), daemon=True)
        t.start()
        threads.append(t)


def _raw_conn(conn: socket.socket, buf: memoryview) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cmd = bytearray(RAW_CMD.size)
    with conn:
        while True:
            got = 0
            while got < RAW_CMD.size:
                k = conn.recv_into(memoryview(cmd)[got:])
                if k == 0:
                    return
                got += k
            op, n = RAW_CMD.unpack(cmd)
            if op == b"R":
                conn.sendall(buf[:n])
            else:
                pos = 0
                while pos < n:
                    k = conn.recv_into(buf[pos:n])
                    if k == 0:
                        return
                    pos += k
                conn.sendall(b"k")


def _segment(name: str, size: int, disk_dir: str | None) -> SegmentMemory:
    """A memfd segment, or (`disk_dir`) a disk tier's data file mapped as a node mounts it."""
    if disk_dir is None:
        return SegmentMemory.create(name, size)
    path = os.path.join(disk_dir, DISK_FILE_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return SegmentMemory.map_file(name, path, size, populate=False, share=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvpool.transfer.serve")
    p.add_argument("--name", default="seg")
    p.add_argument("--size", default="64MiB")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--fill", action="store_true", help="fill byte i with i % 251")
    p.add_argument("--raw", action="store_true", help="also serve the raw-socket baseline")
    p.add_argument("--watch-stdin", action="store_true", help="exit when stdin reaches EOF")
    p.add_argument("--disk-dir", default=None, help="serve a disk tier's data file made here")
    args = p.parse_args(argv)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # the wakeup fd does the work

    mem = _segment(args.name, parse_size(args.size), args.disk_dir)
    server = TransferServer(args.host, args.port)
    raw: socket.socket | None = None
    raw_thread: threading.Thread | None = None
    try:
        if args.fill:
            import numpy as np

            arr = np.frombuffer(mem.buffer, dtype=np.uint8)
            period = np.arange(251, dtype=np.uint8)
            arr[:] = np.tile(period, -(-mem.size // 251))[: mem.size]
            del arr
        server.add_segment(mem)
        extra = ""
        if args.raw:
            raw = socket.create_server((args.host, 0))
            raw_buf = memoryview(bytearray(mem.size))
            raw_buf[:] = mem.buffer  # touched, like the segment
            raw_thread = threading.Thread(target=_serve_raw, args=(raw, raw_buf), daemon=True)
            raw_thread.start()
            extra = f" raw {args.host}:{raw.getsockname()[1]}"
        sys.stdout.write(
            f"listening on {server.endpoint} segment {mem.name} size {mem.size} "
            f"shm_path {mem.shm_path} host_id {host_id()}{extra}\n"
        )
        sys.stdout.flush()
        watch = [wake_r] + ([sys.stdin.fileno()] if args.watch_stdin else [])
        while True:
            ready, _, _ = select.select(watch, [], [])
            if wake_r in ready:
                break
            if os.read(sys.stdin.fileno(), 65536) == b"":
                break
    finally:
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)
            raw.close()
        server.close()
        mem.close()
        os.close(wake_r)
        os.close(wake_w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
