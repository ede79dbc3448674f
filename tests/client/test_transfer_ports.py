"""`Store(transfer_port_range=...)`: the transfer server listens on a free port of a range.

The Mooncake layer names a store with a segment after its transfer server's port and must
answer a port of Mooncake's 12300-14300 (issue #20), so the port can be asked for in a range
(`kvpool.client.node.bind_transfer_server`): tried in a random order, bounded, with a clear error
when none is free.
"""

from __future__ import annotations

import socket

import pytest

from kvpool.client.config import StoreConfig
from kvpool.client.node import bind_transfer_server
from kvpool.client.store import Store
from kvpool.errors import InvalidParams, TransferError
from kvtest.procs import free_port, kvpool_proc

RANGE = (12300, 14300)


@pytest.mark.parametrize(
    "bad", [(2, 1), (0, 10), (1, 65536), ("1", 2), (1.0, 2), (True, 2), (1, 2, 3), 5, "1-2"]
)
def test_a_bad_port_range_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(InvalidParams, match="transfer_port_range"):
        StoreConfig(transfer_port_range=bad)  # type: ignore[arg-type]


def test_a_range_from_a_config_file_is_a_pair() -> None:
    config = StoreConfig(transfer_port_range=[12300, 14300])  # type: ignore[arg-type]
    assert config.transfer_port_range == RANGE


def test_the_transfer_server_listens_in_the_range_asked() -> None:
    port = free_port()
    master = kvpool_proc("master", "--port", str(port), name="master")
    try:
        master.wait_ready()
        with (
            Store(f"127.0.0.1:{port}", segment_size="4MiB", transfer_port_range=RANGE) as first,
            Store(f"127.0.0.1:{port}", segment_size="4MiB", transfer_port_range=RANGE) as second,
        ):
            ports = set()
            for store in (first, second):
                (segment,) = store.segments
                endpoint = segment.rsplit("/", 1)[0]
                ports.add(int(endpoint.rpartition(":")[2]))
            assert len(ports) == 2 and all(RANGE[0] <= p <= RANGE[1] for p in ports)
            first.put("in-range", b"v" * 4096)
            assert second.get("in-range") == b"v" * 4096
    finally:
        master.stop()


def test_no_free_port_in_the_range_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = int(taken.getsockname()[1])
        with pytest.raises(TransferError, match=f"no free port on 127.0.0.1 in {port}..{port}"):
            bind_transfer_server("127.0.0.1", (port, port))


def test_a_free_port_of_the_range_is_taken() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = bind_transfer_server("127.0.0.1", (port, port))
    try:
        assert server.port == port
    finally:
        server.close()
