"""Fixtures of the security tests (the throwaway PKI is in `security.pki`)."""

from security.pki import pki

__all__ = ["pki"]
