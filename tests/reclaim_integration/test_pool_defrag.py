"""Issue #13 in pool mode, end to end: a fragmented pool never refuses a put it could hold.

A real `kvpool master --eviction-mode pool` and two real `kvpool node`s with 32 MiB segments;
one Store (one replica per object: pool mode may then drop nothing) puts values of 4 KiB to
4 MiB (log-uniform, fixed seed) and random removals hold the pool at about 70 %, which leaves
the free bytes in pieces. Before pool-mode defragmentation (`kvpool.master.reclaim.defrag`)
a share of those puts was refused with NO_AVAILABLE_HANDLE although each segment had ten
MiB free; now the master moves neighbours out of one range (MOVE tasks the nodes execute),
the refused put is told when to ask again, and it succeeds. Every value still held is then
read back and compared byte for byte (the moved ones included).
"""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest

from kvpool.client import Store
from kvpool.errors import ErrorCode, NoSpace, ObjectError
from kvtest.pool import PoolFactory, pool  # noqa: F401

SEGMENT = 32 << 20
NODES = 2
HOLD = 0.70
PUTS = 1000


@pytest.mark.parametrize(
    ("arena_size", "batch"), [(0, 1), (64 << 20, 1), (0, 4)], ids=["no-arenas", "arenas", "batches"]
)
def test_mixed_sizes_through_a_fragmented_pool_mode_pool_never_fail(
    pool: PoolFactory,  # noqa: F811
    arena_size: int,
    batch: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`batches`: `batch_put` of four values at a time (the refused keys of a batch retry)."""
    caplog.set_level(logging.DEBUG, logger="kvpool.client.writer")
    p = pool(nodes=NODES, segment_size="32MiB", master_args=("--eviction-mode", "pool"))
    rng = random.Random(13)
    data = np.random.default_rng(13).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
    view = memoryview(data)
    held: dict[str, tuple[int, int]] = {}  # key -> (start in data, size)
    used = busy = 0
    refused: list[int] = []
    with Store(p.address, arena_size=arena_size) as s:
        for i in range(0, PUTS, batch):
            keys = [f"v{i + j}" for j in range(batch)]
            places: list[tuple[int, int]] = []
            for _ in keys:
                size = int(2 ** rng.uniform(12, 22))
                places.append((rng.randrange(0, len(data) - size + 1), size))
            values = [view[start : start + size] for start, size in places]
            if batch == 1:
                try:
                    assert s.put(keys[0], values[0]) is True
                    codes = [ErrorCode.OK]
                except NoSpace:
                    codes = [ErrorCode.NO_AVAILABLE_HANDLE]
            else:
                codes = s.batch_put(keys, values)
            for key, place, code in zip(keys, places, codes, strict=True):
                if code is ErrorCode.NO_AVAILABLE_HANDLE:
                    refused.append(place[1])
                    continue
                assert code is ErrorCode.OK, (key, code)
                held[key] = place
                used += place[1]
            while used > HOLD * NODES * SEGMENT:
                gone = rng.choice(sorted(held))
                try:
                    s.remove(gone)
                except ObjectError as exc:
                    # Pool-mode kswapd is moving it off a segment above the high watermark
                    # (a move refuses a Remove until it ends): another one goes instead.
                    assert exc.code is ErrorCode.OBJECT_HAS_REPLICATION_TASK, exc
                    busy += 1
                    assert busy < PUTS, "removals keep meeting moves"
                    continue
                used -= held.pop(gone)[1]
        mismatched = [
            k for k, (start, size) in held.items() if s.get(k) != data[start : start + size]
        ]
    waited = sum("while room was made" in r.getMessage() for r in caplog.records)
    print(
        f"puts={PUTS} refused={len(refused)} waited={waited} busy={busy} held={len(held)} "
        f"used={used / (NODES * SEGMENT):.2f}"
    )
    assert refused == [], f"{len(refused)} of {PUTS} puts refused: sizes {refused[:20]}"
    assert mismatched == []
    assert waited > 0  # the case this test is for did happen: puts waited for moves
