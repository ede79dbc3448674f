"""kvpool.engines: native kvpool backends for inference engines (docs/engines.md).

Each engine loads its backend by module path, so nothing here is imported by the rest of kvpool
and none of the engines is a dependency of kvpool:

    settings.py  EngineSettings: the pool an engine backend connects to (master, tenant, ...),
                 parsed from the engine's own config mapping, validated, frozen
    memory.py    PinnedRegions: zero-copy puts and gets between engine memory (raw addresses,
                 as `tensor.data_ptr()`) and the pool, through `Store.put_from`/`get_into`
    sglang.py    KvpoolHiCacheStorage: SGLang's `HiCacheStorage` (`--hicache-storage-backend
                 dynamic`), imports sglang and torch
    lmcache.py   KvpoolConnectorAdapter / KvpoolConnector: LMCache's remote connector
                 (`remote_url: kvpool://HOST:PORT`, a remote storage plugin), imports lmcache

`settings.py` and `memory.py` need only kvpool's own dependencies; the engine modules need their
engine installed (`scripts/engines/build ENGINE`). They reach the pool only through the public
`kvpool.client.Store`.
"""
