"""kvpool.master (see its README or module docstring once written)."""
