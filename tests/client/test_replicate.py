"""ReplicateConfig: validated at construction, converted once to the wire form."""

from __future__ import annotations

import pytest

from kvpool.client import ReplicateConfig, SoftPinAction
from kvpool.errors import ErrorCode, InvalidParams
from kvpool.protocol.messages import ReplicateConfigMsg


def test_defaults_match_mooncake() -> None:
    cfg = ReplicateConfig()
    assert cfg.replica_num == 1
    assert cfg.soft_pin_action is SoftPinAction.PRESERVE
    assert cfg.soft_pin_ttl_ms is None
    assert cfg.with_hard_pin is False
    assert cfg.preferred_segments == ()
    assert cfg.group_ids is None


def test_to_msg_carries_every_field_and_is_cached() -> None:
    cfg = ReplicateConfig(
        replica_num=2,
        soft_pin_action=SoftPinAction.ENABLE,
        soft_pin_ttl_ms=5000,
        with_hard_pin=True,
        preferred_segments=["a:1/0", "b:2/0"],
        prefer_alloc_in_same_node=True,
        group_ids=["g1", "g2"],
    )
    msg = cfg.to_msg()
    assert msg == ReplicateConfigMsg(
        replica_num=2,
        soft_pin_action=SoftPinAction.ENABLE,
        soft_pin_ttl_ms=5000,
        with_hard_pin=True,
        preferred_segments=["a:1/0", "b:2/0"],
        prefer_alloc_in_same_node=True,
        group_ids=["g1", "g2"],
    )
    assert cfg.to_msg() is msg


def test_soft_pin_action_accepts_its_name() -> None:
    assert ReplicateConfig(soft_pin_action="enable").soft_pin_action is SoftPinAction.ENABLE  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"replica_num": 0},
        {"replica_num": -1},
        {"replica_num": True},
        {"replica_num": 1.0},
        {"replica_num": 1000},
        {"soft_pin_action": "sometimes"},
        {"soft_pin_ttl_ms": 100},  # a TTL needs ENABLE (Mooncake: INVALID_PARAMS)
        {"soft_pin_action": SoftPinAction.DISABLE, "soft_pin_ttl_ms": 100},
        {"soft_pin_action": SoftPinAction.ENABLE, "soft_pin_ttl_ms": -5},
        {"with_hard_pin": 1},
        {"preferred_segments": "a:1/0"},
        {"preferred_segments": [""]},
        {"group_ids": [3]},
    ],
)
def test_bad_configs_are_refused_with_invalid_params(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidParams) as info:
        ReplicateConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.INVALID_PARAMS


def test_group_ids_must_give_one_group_per_key() -> None:
    cfg = ReplicateConfig(group_ids=["g1", "g2"])
    cfg.check_batch(2)
    with pytest.raises(InvalidParams):
        cfg.check_batch(3)
