"""kvpool.demo: the main job (`kvpool demo`, `make run`) and the terminal helpers of commands.

`workload` makes the prompts, prefix-chunk keys and synthetic KV tensors (deterministic across
processes); `worker` runs a prefill or a decode instance as its own process; `progress` draws
progress bars. Uses the public client API only.
"""
