"""The process's file-descriptor limit: raising it, and sizing connection caps below it.

Every connection a server holds costs a file descriptor, and a process with none left cannot
accept, open a file or start a child: with the common soft limit of 1,024, 1,100 idle sockets
once made the master refuse every new client with "connection reset" (accept failed with
EMFILE before any code of ours ran). So a server process raises its soft limit to its hard limit
at start (`raise_fd_limit`, called by `kvpool master`), and every server caps its connections
below what is left (`connection_cap`), refusing the rest itself, clearly.

A library must not raise the limit of a process it merely runs in (code there may still use
``select()``, which breaks on descriptors above 1,023), so the Store's own transfer server only
sizes its cap from the current limit.
"""

from __future__ import annotations

import contextlib
import resource
from typing import Final

__all__ = ["FD_RESERVE", "connection_cap", "fd_soft_limit", "raise_fd_limit"]

#: Descriptors a server keeps for everything but connections (listeners, logs, children, ...).
FD_RESERVE: Final = 64


def fd_soft_limit() -> int:
    """RLIMIT_NOFILE's soft limit now (a very large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (when allowed); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        # An unlimited hard limit: ask for Linux's nr_open default, the most a process may.
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        # On failure keep the soft limit we have; the caps are sized from it.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return fd_soft_limit()


def connection_cap(wanted: int, share: float = 1.0) -> int:
    """`wanted`, or less so that `share` of the descriptors this process may still open (after
    `FD_RESERVE`) are enough for that many connections; at least 1."""
    room = int((fd_soft_limit() - FD_RESERVE) * share)
    return max(1, min(wanted, room))
