"""deploy/grafana/kvpool.json queries only metrics a running pool exports (master and node),
and deploy/prometheus.yml is YAML naming both jobs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvpool import Store
from kvtest.ops_http import http_base, metrics_text
from kvtest.pool import PoolFactory, pool  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"\b((?:kvpool|master)_[a-z0-9_]+)\b")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? \S+$")


def _names(base: str) -> set[str]:
    text = metrics_text(base)
    return {m.group(1) for line in text.splitlines() if (m := _SAMPLE.match(line))}


def _queried() -> set[str]:
    dash = json.loads((ROOT / "deploy/grafana/kvpool.json").read_text())
    exprs = [t["expr"] for panel in dash["panels"] for t in panel["targets"]]
    assert exprs
    return {name for e in exprs for name in _NAME.findall(e)}


def test_every_metric_the_grafana_dashboard_queries_is_exported(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=0, segment_size="8MiB", master_args=("--http-port", "0"))
    node = p.add_node(None, "--http-port", "0")
    master_base = http_base(p.master)
    node_base = http_base(node)
    with Store(p.address, protocol="tcp") as store:
        for i in range(5):
            store.put(f"g-{i}", b"g" * 1000)
            store.get(f"g-{i}")
    exported = _names(master_base) | _names(node_base)
    missing = sorted(_queried() - exported)
    assert missing == [], f"queried by deploy/grafana/kvpool.json but not exported: {missing}"


def test_prometheus_config_scrapes_the_master_and_the_nodes() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"kvpool-master", "kvpool-node"}
    assert jobs["kvpool-master"]["static_configs"][0]["targets"] == ["127.0.0.1:9003"]
