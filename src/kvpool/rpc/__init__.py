"""kvpool.rpc (see its README or module docstring once written)."""
