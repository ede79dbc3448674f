"""A node's /metrics against a live pool: a remote (TCP) reader moves its transfer counters by
exactly the requests and bytes it made."""

from __future__ import annotations

from kvpool import Store
from kvtest.ops_http import http_base, metrics_text, samples
from kvtest.pool import PoolFactory, pool  # noqa: F401


def scrape(base: str) -> dict[str, float]:
    return samples(metrics_text(base))


def test_node_exports_segment_bytes_and_transfer_counters(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=0, segment_size="8MiB")
    node = p.add_node(None, "--http-port", "0")
    base = http_base(node)
    before = scrape(base)
    assert before["kvpool_node_segments"] == 1
    seg = [k for k in before if k.startswith("kvpool_node_segment_bytes{")]
    assert len(seg) == 1 and before[seg[0]] == 8 * 1024 * 1024
    with Store(p.address, protocol="tcp") as store:
        for i in range(10):
            store.put(f"n-{i}", b"n" * 10_000)
        for i in range(10):
            assert store.get(f"n-{i}") == b"n" * 10_000
    after = scrape(base)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta('kvpool_transfer_requests_total{op="write"}') == 10
    assert delta('kvpool_transfer_bytes_total{op="write"}') == 100_000
    assert delta('kvpool_transfer_requests_total{op="read"}') == 10
    assert delta('kvpool_transfer_bytes_total{op="read"}') == 100_000
    assert after["kvpool_transfer_connections_accepted_total"] >= 1
    assert after["kvpool_transfer_refused_requests_total"] == 0
    assert delta("kvpool_transfer_tier_reads_total") == 0  # memory reads: no disk tier read
    assert "kvpool_transfer_sendfile_reads_total" in after
