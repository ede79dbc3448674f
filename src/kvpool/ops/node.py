"""A node's metrics over HTTP (`kvpool node --http-port`), served from a thread of its own.

`NodeCollector` reads, at scrape time, the node's segments (`NodeRuntime.segments`) and its
transfer server's counters (`TransferServer.counters`: per-worker plain ints, summed here; the
server's connections, accepted and refused). `NodeHttp` serves `/metrics` and `/health` on an
`HttpServer` whose event loop runs in a daemon thread (a node has no loop of its own; the
transfer server's threads never wait on it). `close()` stops it; idempotent.

Same-host peers copy through shared memory without the transfer server: their bytes are not
counted here (the Store that reads counts them).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from kvpool.client.node import NodeRuntime
from kvpool.ops.http import HttpRequest, HttpServer, Response, json_response

__all__ = ["NodeCollector", "NodeHttp"]


class NodeCollector(Collector):
    """kvpool_node_* and kvpool_transfer_* families of one node."""

    def __init__(self, runtime: NodeRuntime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Any]:
        rt = self._runtime
        seg = GaugeMetricFamily(
            "kvpool_node_segment_bytes", "Bytes of a segment this node serves.", labels=["segment"]
        )
        segments = list(rt.segments.items())
        for name, (mem, _info) in segments:
            seg.add_metric([name], float(mem.size))
        yield seg
        yield GaugeMetricFamily(
            "kvpool_node_segments", "Segments this node has mounted.", value=float(len(segments))
        )
        server = rt.transfer_server
        if server is None:
            return
        c = server.counters()
        req = CounterMetricFamily(
            "kvpool_transfer_requests", "Transfer requests served, by op.", labels=["op"]
        )
        req.add_metric(["read"], float(c.reads))
        req.add_metric(["write"], float(c.writes))
        yield req
        nbytes = CounterMetricFamily(
            "kvpool_transfer_bytes", "Payload bytes served, by op.", labels=["op"]
        )
        nbytes.add_metric(["read"], float(c.read_bytes))
        nbytes.add_metric(["write"], float(c.write_bytes))
        yield nbytes
        for metric, doc, v in (
            (
                "kvpool_transfer_refused_requests",
                "Requests answered with an error (unknown segment, out of bounds, malformed).",
                c.refused,
            ),
            ("kvpool_transfer_stalls", "Connections closed for stalling.", c.stalls),
            ("kvpool_transfer_tier_reads", "READs of a disk tier served.", c.tier_reads),
            (
                "kvpool_transfer_sendfile_reads",
                "Disk-tier READs sent with sendfile.",
                c.sendfile_reads,
            ),
            ("kvpool_transfer_errors", "Connections ended by an error.", c.errors),
            (
                "kvpool_transfer_connections_accepted",
                "Connections accepted.",
                server.accepted_connections,
            ),
            (
                "kvpool_transfer_connections_refused",
                "Connections refused by the caps.",
                server.refused_connections,
            ),
        ):
            yield CounterMetricFamily(metric, doc, value=float(v))
        yield GaugeMetricFamily(
            "kvpool_transfer_connections",
            "Transfer connections open now.",
            value=float(server.connection_count()),
        )
        yield GaugeMetricFamily(
            "kvpool_transfer_workers", "Worker threads started.", value=float(server.worker_count())
        )


class NodeHttp:
    """`/metrics` and `/health` of a node, served by a daemon thread's event loop."""

    def __init__(self, runtime: NodeRuntime, host: str = "127.0.0.1", port: int = 0) -> None:
        self._runtime = runtime
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(runtime))
        tls = runtime.tls  # the node's --tls-*: its HTTP port speaks HTTPS too
        context = tls.server_context() if tls is not None and tls.cert else None
        self._http = HttpServer(host, port, context)
        self._http.route("GET", "/metrics", self._metrics)
        self._http.route("GET", "/health", self._health)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        return self._http.address

    def start(self) -> NodeHttp:
        """Bind (an `OSError` when the port is taken) and serve from a daemon thread."""
        self._loop.run_until_complete(self._http.start())
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kvpool-node-http", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            asyncio.run_coroutine_threadsafe(self._http.close(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()

    def _metrics(self, req: HttpRequest) -> Response:
        return Response(generate_latest(self.registry), CONTENT_TYPE_LATEST)

    def _health(self, req: HttpRequest) -> Response:
        rt = self._runtime
        return json_response(
            {"status": "ok", "client_id": rt.client_id, "segments": list(rt.segments)}
        )
