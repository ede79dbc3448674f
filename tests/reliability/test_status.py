"""`kvpool status` shows what reliability needs an operator to see: silent segments and clients
(kept while their owner may come back) and replica repair (under-replicated objects, copies
queued, running, done, failed), in the table and in `--json`."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kvpool.cli.status import render_table, stats_to_dict, status
from kvpool.protocol import messages as m
from kvtest.pool import PoolFactory, pool  # noqa: F401

SEG = m.SegmentStats(
    m.SegmentName("n0/0"), m.ClientId("c0"), m.HostId("h"), "e:1", 1 << 20, 4096, 3
)


def reply() -> m.StatsReply:
    r = m.StatsReply(0, objects=9)
    r.silent_segments = [SEG]
    r.silent_clients = [m.ClientStats(m.ClientId("c0"), m.HostId("h"), 1, 12.5, 0, True)]
    r.under_replicated, r.repair_queued, r.repair_in_flight = 7, 4, 3
    r.repair_done, r.repair_failed = 11, 2
    return r


def test_the_table_shows_repair_progress_and_silent_members() -> None:
    text = render_table("127.0.0.1:1", reply())
    assert "repair: 7 objects under-replicated, 4 queued, 3 copying, 11 done, 2 failed" in text
    assert "silent segments (kept until their owner is back or dropped): 1" in text
    assert "silent clients: 1" in text and "12.5 s" in text


def test_the_json_names_every_reliability_field() -> None:
    d = stats_to_dict(reply())
    assert d["under_replicated"] == 7 and d["repair_failed"] == 2
    assert d["silent_segments"][0]["name"] == "n0/0"
    assert d["silent_clients"][0]["silent"] is True


def test_status_of_a_live_pool_reports_repair_counters(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="8MiB")
    out = CliRunner().invoke(status, ["--master", p.address, "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    assert d["under_replicated"] == 0 and d["silent_segments"] == [] and d["repair_done"] == 0
