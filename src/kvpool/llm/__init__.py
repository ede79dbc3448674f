"""kvpool.llm: the main job with a real transformer (`make run`, `kvpool demo`, `kvpool bench llm`).

A Llama-architecture model with seeded random weights (built from a config, nothing
downloaded) runs in two engine processes: a prefill engine computes the KV cache of long
prompts and stores every full chunk through the engine-side storage manager (`kvpool.cache`:
L1 in the engine, the pool as L2); a decode engine gets prompts that share those prefixes,
prefetches the longest cached prefix, rebuilds the transformers cache from it and continues,
checking that its logits equal a full recompute's.

    spec.py    JobSpec, ModelSpec, the prompts and chunk keys (numpy only, no torch)
    model.py   the model, KV extraction and cache rebuild (torch and transformers, imported lazily)
    engine.py  `python -m kvpool.llm.engine prefill|decode`: one engine process
    job.py     the embedded pool, both engines, the report (what `kvpool demo` runs)

torch and transformers (the `llm` extra) are imported only inside `model.py`'s functions and the
engine process, so `kvpool demo --help` and the rest of kvpool never need them. This package
may import `kvpool.cache`, `kvpool.client` and `kvpool.demo`; nothing but the CLI and the
benchmarks import it.
"""
