"""A review finding on own eviction (src/kvpool/master/planner.py `admits`,
src/kvpool/master/reclaim/tenants.py `evict_own`).

`admits` asks `reclaim_tenant` to free `over` bytes and only afterwards checks whether the put
fits. When the tenant's evictable objects are fewer than `over` (the rest pinned, leased or
under a task), they are all evicted and the put is still refused TENANT_QUOTA_EXCEEDED:
the refused put destroyed cached objects for nothing. docs (master/quota.py docstring): a put
that cannot fit "fails with TENANT_QUOTA_EXCEEDED (-1700) and changes nothing".
"""

from __future__ import annotations

from pathlib import Path

from kvpool.errors import ErrorCode
from kvpool.master.quota import TenantQuotas
from kvpool.protocol import messages as m
from master.conftest import Clock
from master.test_quota import _keys, _put, _quota_file, _reclaiming, _register

KiB = 1 << 10


def test_a_put_refused_for_its_quota_evicts_nothing(clock: Clock, tmp_path: Path) -> None:
    svc = _reclaiming(clock)
    svc.set_quotas(TenantQuotas(_quota_file(tmp_path, {"a": 100 * KiB})))
    w = m.ClientId("w")
    _register(svc, w)
    assert _put(svc, w, "pinned", 60 * KiB, "a", with_hard_pin=True) == 0
    assert _put(svc, w, "cold", 20 * KiB, "a") == 0
    clock.advance(10)
    # 80 KiB used, 60 pinned: a 50 KiB put cannot fit whatever is evicted (60 + 50 > 100).
    assert _put(svc, w, "new", 50 * KiB, "a") == ErrorCode.TENANT_QUOTA_EXCEEDED
    assert _keys(svc, "a") == {"pinned", "cold"}, "the refused put evicted 'cold'"
