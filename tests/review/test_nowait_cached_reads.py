"""Review finding on `Store(write_mode="nowait", read_mode="cached")`
(src/kvpool/client/writer.py `_send_commit`, src/kvpool/client/pending.py).

`_send_commit` remembers the place a nowait put wrote before the master answered its
PutCommit. When the key already holds another value the commit answers
OBJECT_ALREADY_EXISTS (no failure: the written bytes are not stored), but until that answer
is taken (`PendingCommits.settle` at the *start* of a later call, and only for answers that
were already read) this Store's cached `get` returns the rejected bytes: a value the pool
never stored under the key, while every other client reads the stored one.
docs/parts/client.md ("Read modes") says a cached read "never returns bytes that are not the
value that was put under the key" and may only lag a removal or replacement by another
client; it does not allow returning a value that lost to an existing one.
"""

from __future__ import annotations

from kvpool.client import Store
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401


def test_a_rejected_nowait_put_is_not_read_back(pool: PoolFactory) -> None:  # noqa: F811
    p: Pool = pool(nodes=1, segment_size="16MiB")
    stored, rejected = b"S" * 4096, b"R" * 4096
    with (
        Store(p.address) as first,
        Store(p.address, read_mode="cached", write_mode="nowait") as second,
    ):
        got = []
        for i in range(5):  # several keys: a heartbeat that read one answer early hides one
            key = f"k{i}"
            assert first.put(key, stored) is True
            second.put(key, rejected)  # answers before the master said OBJECT_ALREADY_EXISTS
            got.append(bytes(second.get(key)))
            assert first.get(key) == stored
        second.flush()
        wrong = [i for i, g in enumerate(got) if g != stored]
        assert not wrong, f"cached gets of keys {wrong} returned the bytes of a rejected put"
