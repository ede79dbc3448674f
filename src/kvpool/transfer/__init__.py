"""kvpool.transfer (see its README or module docstring once written)."""
