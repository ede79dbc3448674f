"""The `kvpool bench` commands: each measures one layer next to a baseline taken in the same run.

One module per command (`compare`, `store`, `transfer`, `master`, `reclaim`, `l2`, `chaos` with
`chaos_faults`), plus `rpc` (round-trip cases any service can run on its own messages;
tests/bench/bench_rpc.py drives it) and `peers` (the systems `compare` puts side by side). What they share lives here once:
`kvpool.bench.rows` (the row every command prints and writes as JSON, the percentile, the
median run, the table) and `kvpool.children` (the child processes they start, which die with
the benchmark). Benchmarks check every byte or reply they read and never assert a speed.

Benchmarks may import any layer; no core package (`kvpool.client`, `kvpool.master`, ...)
imports them.
"""
