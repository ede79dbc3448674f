"""kvpool.compat: other systems' client APIs, served by a kvpool pool.

* `kvpool.compat.mooncake`: Mooncake Store's Python API (`MooncakeDistributedStore`,
  `ReplicateConfig`, `MooncakeConfig`, ...), so vLLM, SGLang, LMCache and users' scripts that
  talk to Mooncake switch by changing an import. The opt-in distribution in
  `compat/mooncake-shim/` installs it as the top-level `mooncake.store` module.

May import: kvpool.client (the native `Store` every call is built on), kvpool.errors and
kvpool.config. Never the master, the transfer engine or the protocol directly: what the compat
layer needs from them, the Store offers. docs/compat.md lists what matches Mooncake, what differs
on purpose, and what is not supported yet.
"""
