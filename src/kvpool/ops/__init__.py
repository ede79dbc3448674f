"""The operator's side of a pool: Prometheus metrics and an admin HTTP API.

    http.py      a tiny HTTP/1.1 server on the caller's event loop (GET/POST, JSON replies)
    metrics.py   request counters (plain ints) and Prometheus collectors read at scrape time
    admin.py     the master's admin API: /metrics, /health, /role, /query_key, segments, keys,
                 tenants, on an `HttpServer`

Layering (an import-linter contract): `kvpool.ops` reads the master (and, for nodes, the
client and transfer server) and changes nothing there except through their public methods; no
core package imports `kvpool.ops`: only the CLI wires it in.
"""

from kvpool.ops.http import HttpError, HttpRequest, HttpServer

__all__ = ["HttpError", "HttpRequest", "HttpServer"]
