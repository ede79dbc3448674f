from __future__ import annotations

import pytest

from kvpool import errors
from kvpool.config import format_size, parse_duration, parse_size
from kvpool.errors import ErrorCode


def test_error_codes_carry_mooncake_numbers() -> None:
    assert ErrorCode.OBJECT_NOT_FOUND == -704
    assert ErrorCode.OBJECT_HAS_LEASE == -706
    assert ErrorCode.NO_AVAILABLE_HANDLE == -200
    assert ErrorCode.INVALID_PARAMS == -600
    assert ErrorCode.CHECKSUM_MISMATCH == -801
    assert ErrorCode.TENANT_NOT_EMPTY == -1702
    assert len({int(c) for c in ErrorCode}) == len(ErrorCode)


def test_each_code_maps_to_its_family() -> None:
    assert isinstance(errors.error_for_code(-704), errors.ObjectNotFound)
    assert isinstance(errors.error_for_code(-704), KeyError)
    assert isinstance(errors.error_for_code(-200), errors.NoSpace)
    assert isinstance(errors.error_for_code(-600), ValueError)
    assert isinstance(errors.error_for_code(-713), errors.ObjectError)
    unknown = errors.error_for_code(-123456)
    assert type(unknown) is errors.KVPoolError and unknown.code is ErrorCode.INTERNAL_ERROR


def test_raise_for_code_is_silent_on_ok_and_keeps_the_code() -> None:
    errors.raise_for_code(0)
    with pytest.raises(errors.ObjectHasLease) as info:
        errors.raise_for_code(-706, "leased")
    assert info.value.code is ErrorCode.OBJECT_HAS_LEASE
    assert "leased" in str(info.value) and "-706" in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", 4 << 30),
        ("512MB", 512_000_000),
        ("16 MiB", 16 << 20),
        ("1024", 1024),
        (7, 7),
        ("1.5KiB", 1536),
    ],
)
def test_sizes_parse_in_decimal_and_binary_units(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "4 parsecs", "-1", "GiB", "50%", True, 1.5])
def test_malformed_sizes_name_the_offending_value(bad: object) -> None:
    with pytest.raises(errors.InvalidParams) as info:
        parse_size(bad, name="segment_size")  # type: ignore[arg-type]
    assert "segment_size" in str(info.value)


def test_size_minimum_is_enforced() -> None:
    with pytest.raises(errors.InvalidParams, match="minimum"):
        parse_size("512", minimum=1024)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30s", 30.0), ("500ms", 0.5), ("10min", 600.0), ("24h", 86400.0), (2, 2.0)],
)
def test_durations_parse(text: str | float, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


def test_malformed_duration_is_refused() -> None:
    with pytest.raises(errors.InvalidParams, match="client_ttl"):
        parse_duration("soon", name="client_ttl")


def test_format_size() -> None:
    assert format_size(4096) == "4.0 KiB"
    assert format_size(12) == "12 B"


def test_codes_module_names_every_error_code_with_its_number() -> None:
    import kvpool.codes as codes

    assert set(codes.__all__) == {c.name for c in ErrorCode}
    for c in ErrorCode:
        value = getattr(codes, c.name)
        assert type(value) is int
        assert value == int(c)
