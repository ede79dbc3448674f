"""Durable metadata on one machine (issue #14), with real processes on loopback: a master run
with `--data-dir`, killed with SIGKILL and started again on the same port and directory, gets
every acknowledged object back once the nodes remounted (their memory still holds the bytes),
and takes new puts."""

from __future__ import annotations

from pathlib import Path

from kvpool.client import ReplicateConfig, Store
from kvtest.pool import Pool
from kvtest.procs import Proc, free_port, kvpool_proc, run_kvpool, wait_until
from kvtest.query import replica_segments, stats
from kvtest.values import random_values


def values(prefix: str, n: int, seed: int) -> dict[str, bytes]:
    return random_values(prefix, n, seed, 1500, 53)


def start_master(port: int, data_dir: Path, name: str) -> Proc:
    proc = kvpool_proc(
        "master",
        "--port",
        str(port),
        "--client-ttl",
        "2s",
        "--client-dead-ttl",
        "60s",
        "--data-dir",
        str(data_dir),
        "--snapshot-interval",
        "1s",
        name=name,
    )
    proc.wait_ready(timeout=30)
    return proc


def test_a_master_killed_and_restarted_on_its_data_dir_serves_every_acknowledged_key(
    tmp_path: Path,
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    data_dir = tmp_path / "meta"
    p = Pool(master=start_master(port, data_dir, "master 1"), address=address)
    p.segment_size = "16MiB"
    try:
        p.add_node()
        p.add_node()
        one = values("one", 40, 1)
        two = values("two", 40, 2)
        with Store(address) as s:
            for k, v in one.items():
                assert s.put(k, v)
            for k, v in two.items():
                assert s.put(k, v, ReplicateConfig(replica_num=2))
            s.remove("one-0")
            assert all(len(found) == 2 for found in replica_segments(address, list(two)))
            segs = {x.name for x in stats(address).segments}
            wait_until(
                lambda: (
                    len(list(data_dir.glob("snapshot-*.kvp"))) == 1
                    and any(int(x.stem.split("-")[1]) > 1 for x in data_dir.glob("snapshot-*.kvp"))
                ),
                timeout=20,
                what="a periodic snapshot to replace the first one",
            )
            for k, v in values("late", 10, 3).items():  # in the log after the snapshot
                assert s.put(k, v)
                one[k] = v
            p.master.kill9()
            p.master = start_master(port, data_dir, "master 2")
            # The nodes' heartbeats are told NEED_REMOUNT; their generations match.
            wait_until(
                lambda: {x.name for x in stats(address).segments} == segs,
                timeout=30,
                what="both nodes to remount their segments at the restarted master",
            )
            del one["one-0"]
            for k, v in {**one, **two}.items():
                assert s.get(k) == v, k
            assert not s.exists("one-0")
            assert all(len(found) == 2 for found in replica_segments(address, list(two)))
            for k, v in values("after", 20, 4).items():
                assert s.put(k, v, ReplicateConfig(replica_num=2))
                assert s.get(k) == v
    finally:
        p.stop()


def test_a_master_refuses_a_data_dir_damaged_before_its_last_record(tmp_path: Path) -> None:
    data_dir = tmp_path / "meta"
    port = free_port()
    first = start_master(port, data_dir, "master 1")
    try:
        with Store(f"127.0.0.1:{port}", segment_size="4MiB") as s:
            for k, v in values("k", 20, 5).items():
                assert s.put(k, v)
    finally:
        first.stop()
    (log,) = sorted(data_dir.glob("log-*.kvp"))[-1:]
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF
    log.write_bytes(bytes(data))
    proc = run_kvpool("master", "--port", "0", "--data-dir", str(data_dir))
    assert proc.returncode != 0
    assert "corrupt record" in proc.stderr and log.name in proc.stderr, proc.stderr
