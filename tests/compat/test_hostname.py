"""`get_hostname()` of stores that contribute memory: Mooncake's "host:port" with the port in
12300-14300 (issue #20), and still the name other processes find the store's segment by.

Mooncake names a store after its transfer engine's RPC port, which it takes from
MC_STORE_CLIENT_MIN_PORT..MAX_PORT (12300-14300); code that parses the name (or checks the
range) must work on kvpool too. A kvpool store with a segment is named after its transfer
server, so that server listens on a port of that range (`Store(transfer_port_range=...)`).
"""

from __future__ import annotations

import sys
from typing import Any

from kvpool.children import Child

MOONCAKE_PORTS = range(12300, 14301)
SEGMENT = 16 << 20

# A store in another process: it contributes a segment, puts one value into it (placed there
# by its own name), prints its name and runs until EOF on its stdin (the test's `Child.stop`).
CHILD = """
import importlib, sys, threading
m = importlib.import_module(sys.argv[1])
store = m.MooncakeDistributedStore()
rc = store.setup("127.0.0.1", sys.argv[2], int(sys.argv[3]), int(sys.argv[3]), "tcp", "", sys.argv[4])
assert rc == 0, rc
cfg = m.ReplicateConfig()
cfg.preferred_segments = [store.get_hostname()]
rc = store.put("hostname-from-child", b"child bytes " * 100, cfg)
assert rc == 0, rc
print("hostname", store.get_hostname(), flush=True)
sys.stdin.readline()  # until the test closes our stdin
store.close()
"""


def _in_range(hostname: str) -> int:
    host, _, port = hostname.rpartition(":")
    assert host == "127.0.0.1", hostname
    assert int(port) in MOONCAKE_PORTS, hostname
    return int(port)


def test_stores_with_memory_are_named_in_mooncakes_port_range(backend: Any) -> None:
    first = backend.store(segment=SEGMENT)
    second = backend.store(segment=SEGMENT)
    assert _in_range(first.get_hostname()) != _in_range(second.get_hostname())
    # Each is still the name of its own segment: a put placed by it lands there.
    cfg = backend.module.ReplicateConfig()
    cfg.preferred_segments = [second.get_hostname()]
    assert first.put("hostname-placed", b"p" * 4096, cfg) == 0
    (desc,) = first.get_replica_desc("hostname-placed")
    where = desc.get_memory_descriptor().buffer_descriptor
    assert where.transport_endpoint == second.get_hostname()
    assert second.get("hostname-placed") == b"p" * 4096


def test_another_process_finds_a_store_by_its_name_in_the_range(backend: Any) -> None:
    here = backend.store(segment=SEGMENT)
    args = [backend.module.__name__, backend.metadata_server, str(SEGMENT), backend.master]
    with Child([sys.executable, "-c", CHILD, *args], name="hostname-child", stdin=True) as child:
        line = child.wait_line(r"^hostname (\S+)$", timeout=30)
        theirs = line.group(1)
        assert _in_range(theirs) != _in_range(here.get_hostname())
        # What the other process put into its own segment is read here (over its transfer
        # server, found by the master under the segment's name) ...
        assert here.get("hostname-from-child") == b"child bytes " * 100
        (desc,) = here.get_replica_desc("hostname-from-child")
        assert desc.get_memory_descriptor().buffer_descriptor.transport_endpoint == theirs
        # ... and a put naming the other process's store by its name lands in its segment.
        cfg = backend.module.ReplicateConfig()
        cfg.preferred_segments = [theirs]
        assert here.put("hostname-to-child", b"to the child " * 50, cfg) == 0
        (desc,) = here.get_replica_desc("hostname-to-child")
        assert desc.get_memory_descriptor().buffer_descriptor.transport_endpoint == theirs
        assert here.get("hostname-to-child") == b"to the child " * 50
        assert child.stop(grace=20) == 0  # EOF on its stdin: it closes its store and exits
