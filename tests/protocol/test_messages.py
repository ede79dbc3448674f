"""The layout of the master's messages: split in two modules, one import path."""

from __future__ import annotations

from pathlib import Path

import msgspec

import kvpool.protocol.messages as messages
import kvpool.protocol.values as values


def test_messages_module_stays_under_800_lines() -> None:
    text = Path(messages.__file__).read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 800


def test_every_value_type_is_still_importable_from_messages() -> None:
    for name in values.__all__:
        assert getattr(messages, name) is getattr(values, name)
    assert set(values.__all__) - {"DEFAULT_REPLICATE_CONFIG"} <= set(messages.__all__)


def test_a_shared_struct_round_trips_under_its_class_name_tag() -> None:
    desc = messages.ReplicaDesc(
        7, messages.ReplicaKind.MEMORY, messages.ReplicaStatus.COMPLETE, "seg/0", 64, 128
    )
    wire = msgspec.msgpack.encode(desc)
    assert msgspec.msgpack.decode(wire) == ["ReplicaDesc", 7, 0, 3, "seg/0", 64, 128, ""]
    assert msgspec.msgpack.decode(wire, type=messages.ReplicaDesc) == desc
