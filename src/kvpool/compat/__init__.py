"""kvpool.compat: other systems' client APIs, served by a kvpool pool.

* `kvpool.compat.mooncake`: Mooncake Store's Python API (`MooncakeDistributedStore`,
  `ReplicateConfig`, `MooncakeConfig`, ...), so vLLM, SGLang, LMCache and users' scripts that
  talk to Mooncake switch by changing an import. The opt-in distribution in
  `compat/mooncake-shim/` installs it as the top-level `mooncake.store` module.
* `kvpool.compat.mooncake_flags`: Mooncake's master command line (gflags syntax, Mooncake's
  units) read and turned into `kvpool master` arguments; `kvpool.cli.mooncake_master` runs them
  (the shim's `mooncake_master` command).
* `kvpool.compat.mooncake_metadata`: the `mooncake_http_metadata_server` command, a no-op.
* `kvpool.compat.mooncake_service`: Mooncake's REST store service (`mooncake_store_service`).
* `kvpool.compat.mooncake_client`: the per-host standalone client `setup_dummy` attaches to
  (`mooncake_client`).

May import: kvpool.client (the native `Store` every call is built on), kvpool.errors,
kvpool.codes and kvpool.config, and from kvpool.protocol only the value types the Store's answers
are made of (`ReplicaDesc` and `ReplicaKind`, what `Store.get_replica_desc` answers). Never the
master, the RPC layer or the transfer engine: what the compat layer needs from them, the Store
offers (the import-linter contract in pyproject.toml holds this). docs/compat.md lists what
matches Mooncake, what differs on purpose, and what is not supported yet.
"""
