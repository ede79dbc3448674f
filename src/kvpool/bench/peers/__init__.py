"""The systems `kvpool bench compare` puts side by side, each behind one `Driver` interface.

Modules: `base` (the interface, `Unavailable`, `BenchError`), `limits` (memcpy and raw-socket
ceilings), `redis_peer`, `mooncake_peer`, `kvpool_peer` (the systems), `workload` (cases, values,
the interleaved timing loop and byte-exact verification) and `report` (table, ratios, JSON rows,
plot). `kvpool.bench.compare` is the command that ties them together. Drivers import their
system's client lazily in `setup`, so a missing optional dependency only marks that system as
skipped. The servers a driver starts are `kvpool.children.Child` processes, which die with the
benchmark even when it is killed.
"""
