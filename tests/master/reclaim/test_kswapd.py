"""The asyncio kswapd task: wakes on pressure, reclaims in steps, expires soft pins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvpool.errors import ErrorCode
from kvpool.master.reclaim import ListState, ReclaimConfig
from kvpool.master.reclaim.kswapd import Kswapd
from kvpool.master.reclaim.simulated import ManualClock, SimulatedPool

SIZE = 100


async def until(predicate: Callable[[], bool], what: str, rounds: int = 10_000) -> None:
    """Let the loop run until `predicate` holds; everything is in one loop, so no timing."""
    for _ in range(rounds):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def test_kswapd_task_reclaims_to_the_low_watermark_in_steps_between_puts() -> None:
    clock = ManualClock()
    config = ReclaimConfig(high_watermark_ratio=0.9, eviction_ratio=0.3, kswapd_step_bytes=SIZE)
    pool = SimulatedPool(100 * SIZE, config, num_shards=4, clock=clock)

    async def main() -> None:
        kswapd = Kswapd(pool.engine, interval_s=3600.0)
        kswapd.start()
        try:
            for i in range(91):
                assert pool.put(f"k{i}", SIZE) is ErrorCode.OK
            assert pool.engine.kswapd_wanted()  # crossed 90 %: woken, not yet run
            await until(lambda: not pool.engine.kswapd_wanted(), "kswapd done")
            assert pool.used == 60 * SIZE
            assert pool.engine.stats.kswapd_steps >= 31  # one object per step
            assert pool.engine.stats.direct_calls == 0
        finally:
            await kswapd.close()
            await kswapd.close()  # idempotent
        assert pool.engine.wakeup is None

    asyncio.run(main())


def test_kswapd_task_expires_soft_pins_when_it_wakes() -> None:
    clock = ManualClock()
    pool = SimulatedPool(10 * SIZE, ReclaimConfig(), num_shards=2, clock=clock)
    pool.put("pinned", SIZE, soft_pin_ttl_s=60.0)

    async def main() -> None:
        kswapd = Kswapd(
            pool.engine,
            soft_pins=pool.soft_pins,
            on_pin_expired=pool._on_pin_expired,
            interval_s=3600.0,
        )
        kswapd.start()
        try:
            await until(lambda: kswapd.wakeups == 0, "started")
            clock.advance(30.0)
            kswapd.wake()
            await until(lambda: kswapd.wakeups >= 1, "first wake-up")
            assert pool.objects["pinned"].soft_pin_deadline > 0
            clock.advance(31.0)
            kswapd.wake()
            await until(lambda: kswapd.wakeups >= 2, "second wake-up")
            assert pool.objects["pinned"].soft_pin_deadline == 0.0
            assert len(pool.soft_pins) == 0
        finally:
            await kswapd.close()

    asyncio.run(main())


def test_kswapd_task_survives_a_failing_target() -> None:
    pool = SimulatedPool(10 * SIZE, ReclaimConfig(), num_shards=1, clock=ManualClock())
    for i in range(10):
        pool.put(f"k{i}", SIZE)
    calls: list[int] = []

    def broken_inspect(*_: object) -> object:
        calls.append(1)
        raise RuntimeError("bug in the metadata")

    pool.inspect = broken_inspect  # type: ignore[assignment,method-assign]

    async def main() -> None:
        kswapd = Kswapd(pool.engine, interval_s=3600.0)
        kswapd.start()
        try:
            kswapd.wake()
            await until(lambda: kswapd.wakeups >= 1 and calls != [], "a failed step")
            pool.inspect = SimulatedPool.inspect.__get__(pool)  # type: ignore[method-assign]
            kswapd.wake()
            await until(lambda: not pool.engine.kswapd_wanted(), "recovered")
            assert pool.used <= 85 * SIZE // 10
            # The batch isolated when the target failed went back on the list.
            states = {r.state for k in pool.objects for r in pool.engine.records_of(k)}
            assert states == {ListState.INACTIVE}
        finally:
            await kswapd.close()

    asyncio.run(main())
