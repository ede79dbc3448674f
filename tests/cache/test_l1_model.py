"""L1 against a model, driven by hypothesis: any sequence of writes, reads, aborts and deletes
keeps the states, lock counts, byte accounting and outcomes the model predicts."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvpool.cache.keys import ObjectKey
from kvpool.cache.l1 import L1Config, L1Manager, L1Status
from kvpool.cache.memory import MemoryLayout

KEYS = [ObjectKey("m", 0, bytes([i])) for i in range(6)]
SIZES = [64, 128]
ids = st.integers(0, len(KEYS) - 1)


class L1Machine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = L1Manager(L1Config(capacity_bytes=1 << 20, eviction_watermark=1.0))
        # model: key index -> [state "writing"|"ready", readers, size, temporary]
        self.model: dict[int, list[object]] = {}

    @rule(i=ids, size=st.sampled_from(SIZES), temporary=st.booleans())
    def reserve_write(self, i: int, size: int, temporary: bool) -> None:
        (r,) = self.l1.reserve_write([KEYS[i]], MemoryLayout.of_bytes(size), temporary=temporary)
        if i in self.model:
            assert r.status is L1Status.EXISTS
        else:
            assert r.status is L1Status.OK
            self.model[i] = ["writing", 0, size, temporary]

    @rule(i=ids, with_read=st.booleans())
    def finish_write(self, i: int, with_read: bool) -> None:
        if with_read:
            (r,) = self.l1.finish_write_and_reserve_read([KEYS[i]])
            status = r.status
        else:
            (status,) = self.l1.finish_write([KEYS[i]])
        m = self.model.get(i)
        if m is None:
            assert status is L1Status.NOT_FOUND
        elif m[0] != "writing":
            assert status is L1Status.WRONG_STATE
        else:
            assert status is L1Status.OK
            m[0] = "ready"
            m[1] = 1 if with_read else 0

    @rule(i=ids)
    def abort(self, i: int) -> None:
        (status,) = self.l1.abort_write([KEYS[i]])
        m = self.model.get(i)
        if m is None:
            assert status is L1Status.NOT_FOUND
        elif m[0] != "writing":
            assert status is L1Status.WRONG_STATE
        else:
            assert status is L1Status.OK
            del self.model[i]

    @rule(i=ids)
    def reserve_read(self, i: int) -> None:
        (r,) = self.l1.reserve_read([KEYS[i]])
        m = self.model.get(i)
        if m is None:
            assert r.status is L1Status.NOT_FOUND
        elif m[0] == "writing":
            assert r.status is L1Status.NOT_READY
        else:
            assert r.status is L1Status.OK and r.obj is not None and r.obj.size == m[2]
            m[1] = int(m[1]) + 1  # type: ignore[call-overload]

    @rule(i=ids)
    def finish_read(self, i: int) -> None:
        (status,) = self.l1.finish_read([KEYS[i]])
        m = self.model.get(i)
        if m is None:
            assert status is L1Status.NOT_FOUND
        elif m[0] == "writing" or m[1] == 0:
            assert status is L1Status.WRONG_STATE
        else:
            assert status is L1Status.OK
            m[1] = int(m[1]) - 1  # type: ignore[call-overload]
            if m[1] == 0 and m[3]:
                del self.model[i]  # a temporary object goes with its last reader

    @rule(i=ids)
    def delete(self, i: int) -> None:
        (status,) = self.l1.delete([KEYS[i]])
        m = self.model.get(i)
        if m is None:
            assert status is L1Status.NOT_FOUND
        elif m[0] == "writing" or m[1]:
            assert status is L1Status.LOCKED
        else:
            assert status is L1Status.OK
            del self.model[i]

    @invariant()
    def accounting_matches(self) -> None:
        usage = self.l1.usage()
        assert usage.objects == len(self.model)
        assert usage.used_bytes == sum(int(m[2]) for m in self.model.values())  # type: ignore[call-overload]
        assert usage.writing == sum(1 for m in self.model.values() if m[0] == "writing")
        for i, k in enumerate(KEYS):
            m = self.model.get(i)
            assert self.l1.read_lock_count(k) == (int(m[1]) if m else 0)  # type: ignore[call-overload]
            assert self.l1.contains(k) == (m is not None and m[0] == "ready")

    def teardown(self) -> None:
        self.l1.close()


L1Machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_l1_matches_its_model = L1Machine.TestCase
