"""Echo benchmark of the RPC layer: the floor under every control-plane call.

    .venv/bin/python tests/bench/bench_rpc.py [--quick] [--json FILE] [--n N] [--repeats R]

Starts the test service (tests/rpc/rpc_testkit.py) in its own process on an ephemeral port,
then measures `Say(text)` → `Said(text)` round trips with a 100-byte text through every case of
`kvpool.bench.rpc` over TCP, plus the same lock-step and threaded cases through a *reader-thread*
client (a dedicated thread reads the socket and wakes callers), the design our leader/follower
client was chosen over, plus lock-step over TCP against lock-step over the server's Unix socket
(`lockstep_by_transport`, interleaved). Prints a table of medians over ``--repeats`` runs and
the same-run ratios; ``--json`` writes the rows. Never asserts speed; every reply is checked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import msgspec  # noqa: E402

from kvpool.bench.rpc import (  # noqa: E402
    BenchSpec,
    format_table,
    lockstep_by_transport,
    median_rows,
    run_cases,
)
from kvpool.errors import RpcError  # noqa: E402
from kvpool.protocol.framing import ERROR_FLAG, HEADER, FrameDecoder, encode_frame  # noqa: E402
from kvpool.protocol.handshake import PROTOCOL_VERSION, Hello  # noqa: E402
from kvpool.rpc.client import parse_address  # noqa: E402
from kvtest.procs import Proc  # noqa: E402
from rpc.rpc_testkit import CLUSTER, Response, Said, Say  # noqa: E402

VALUE_SIZE = 100


class ReaderThreadClient:
    """The alternative design, for comparison only: one reader thread per connection reads
    every reply and wakes the calling thread through an Event."""

    def __init__(self, endpoint: str, response_type: Any, cluster_id: str) -> None:
        host, port = parse_address(endpoint)
        self._sock = socket.create_connection((host, port), timeout=10)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._decode = msgspec.msgpack.Decoder(response_type).decode
        self._encode = msgspec.msgpack.Encoder().encode
        self._decoder = FrameDecoder()
        self._sock.sendall(
            encode_frame(0, msgspec.msgpack.encode(Hello(PROTOCOL_VERSION, cluster_id, "rt")))
        )
        frames: list[tuple[int, bytes]] = []
        while not frames:
            frames = self._decoder.feed(self._sock.recv(65536))
        if frames[0][0] & ERROR_FLAG:
            raise RpcError("refused")
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._next = 1
        self._reader = threading.Thread(target=self._read, name="reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(262144)
            except OSError:
                data = b""
            if not data:
                break
            for rid, payload in self._decoder.feed(data):
                with self._lock:
                    slot = self._pending.pop(rid, None)
                if slot is not None:
                    slot[1].append(self._decode(payload))
                    slot[0].set()
        with self._lock:
            for ev, _ in self._pending.values():
                ev.set()

    def connect(self) -> None:
        pass

    def call(self, req: Any) -> Any:
        payload = self._encode(req)
        ev = threading.Event()
        box: list[Any] = []
        with self._lock:
            rid = self._next
            self._next += 1
            self._pending[rid] = (ev, box)
        with self._send_lock:
            self._sock.sendall(HEADER.pack(len(payload) + 8, rid) + payload)
        if not ev.wait(60) or not box:
            raise RpcError("no reply")
        return box[0]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(10)
        self._sock.close()

    def __enter__(self) -> ReaderThreadClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few hundred calls per case")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--n", type=int, default=None, help="calls per case (default 20000)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per case (median kept)")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--window", type=int, default=64)
    args = ap.parse_args(argv)
    n = args.n or (300 if args.quick else 20_000)
    repeats = args.repeats or (1 if args.quick else 3)
    text = "x" * VALUE_SIZE

    def make_request(i: int) -> Say:
        return Say(f"{i:010d}{text[10:]}")

    def check(i: int, reply: Any) -> None:
        if not isinstance(reply, Said) or reply.text[:10] != f"{i:010d}":
            raise AssertionError(f"request {i}: wrong reply {reply!r}")

    server = Proc(
        [sys.executable, str(HERE.parent / "rpc" / "rpc_testkit.py"), "serve"],
        name="rpc-bench-server",
    )
    try:
        endpoint = server.wait_ready()
        spec = BenchSpec(
            endpoint=endpoint,
            response_type=Response,
            make_request=make_request,
            check=check,
            cluster_id=CLUSTER,
            op="echo",
            value_size=VALUE_SIZE,
            n=n,
            window=args.window,
            threads=args.threads,
            # The cases compare client designs over TCP, as the reader-thread client speaks
            # only TCP; lockstep_by_transport compares the transports.
            unix=False,
            path="tcp",
        )
        rt_spec = BenchSpec(
            **{f: getattr(spec, f) for f in spec.__dataclass_fields__ if f != "client_factory"},
            client_factory=lambda s: ReaderThreadClient(s.endpoint, s.response_type, s.cluster_id),
        )
        runs: list[list[dict[str, Any]]] = []
        for _ in range(repeats):
            rows = run_cases(spec)
            alt = run_cases(rt_spec, ("sync-lockstep", "sync-threads"))
            for r in alt:
                r["case"] = "readerthread-" + r["case"].removeprefix("sync-")
            runs.append(rows + alt + lockstep_by_transport(spec))
        final = median_rows(runs)
    finally:
        server.stop()
    print(format_table(final))
    by_case = {r["case"]: r["ops_per_s"] for r in final}
    p50 = {r["case"]: r["p50_us"] for r in final}
    print(
        "\nratios (same run): leader/follower vs reader thread: lock-step "
        f"{by_case['sync-lockstep'] / by_case['readerthread-lockstep']:.2f}x, "
        f"{args.threads} threads {by_case['sync-threads'] / by_case['readerthread-threads']:.2f}x; "
        f"pipelined vs lock-step {by_case['sync-pipelined'] / by_case['sync-lockstep']:.1f}x"
    )
    unix_path = next(r["path"] for r in final if r["case"] == "lockstep-unix")
    print(
        f"unix vs tcp lock-step (interleaved, unix row over {unix_path}): "
        f"{by_case['lockstep-unix'] / by_case['lockstep-tcp']:.2f}x calls/s, "
        f"p50 {p50['lockstep-unix']:.1f} vs {p50['lockstep-tcp']:.1f} us "
        f"({p50['lockstep-tcp'] / p50['lockstep-unix']:.2f}x)"
    )
    if args.json:
        args.json.write_text(json.dumps(final, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
