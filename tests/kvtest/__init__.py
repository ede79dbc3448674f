"""Shared test support: real processes, deadlines, and external servers (never mocks)."""
