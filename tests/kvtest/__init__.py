"""Shared test support: real processes, deadlines, and external servers (never mocks).

One concept a module: `procs` (child processes, `wait_until`, `run_kvpool`, `kvpool_up`),
`pool` (a master and nodes), `stores` (Stores a test closes), `values` (bytes a test can tell
apart), `replicas` (what a Store says of a key's replicas), `dfs` and `disk` (the two tiers'
set-up), `ops_http` (a process's ops HTTP address and /metrics), `query` (a master's Stats and
replica lists), `etcd`, `ha` and `leader` (HA clusters), `llm` (the tiny real-model job).
A test that repeats set-up another test already has takes it from here instead.
"""
