"""Frames: encoding, the streaming decoder under arbitrary chunking, limits and bad prefixes."""

from __future__ import annotations

import gc
import itertools
import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import ErrorCode, InvalidParams
from kvpool.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    ERROR_FLAG,
    HEADER_SIZE,
    ErrorReply,
    FrameDecoder,
    FrameEncoder,
    FrameError,
    FrameTooLarge,
    encode_frame,
)


class Point(msgspec.Struct, tag=True):
    x: int
    label: str


def test_frame_layout_is_length_then_id_then_payload() -> None:
    frame = FrameEncoder().encode(7, Point(1, "a"))
    length, request_id = struct.unpack_from("<IQ", frame)
    assert length == len(frame) - 4
    assert request_id == 7
    assert msgspec.msgpack.decode(frame[HEADER_SIZE:], type=Point) == Point(1, "a")


def test_error_reply_frame_sets_the_error_flag_and_keeps_the_id() -> None:
    frame = FrameEncoder().encode_error(42, ErrorCode.INVALID_PARAMS, "bad")
    [(request_id, payload)] = FrameDecoder().feed(frame)
    assert request_id == 42 | ERROR_FLAG
    assert msgspec.msgpack.decode(payload, type=ErrorReply) == ErrorReply(-600, "bad")


def test_decoder_returns_every_frame_of_one_chunk_in_order() -> None:
    enc = FrameEncoder()
    data = b"".join(enc.encode(i, Point(i, "p" * i)) for i in range(1, 50))
    frames = FrameDecoder().feed(data)
    assert [rid for rid, _ in frames] == list(range(1, 50))
    assert [msgspec.msgpack.decode(p, type=Point).x for _, p in frames] == list(range(1, 50))


def test_decoder_fed_byte_by_byte_yields_each_frame_once_complete() -> None:
    enc = FrameEncoder()
    frames = [enc.encode(i, Point(i, "xyz")) for i in (1, 2)]
    dec = FrameDecoder()
    out = []
    stream = b"".join(frames)
    for i in range(len(stream)):
        got = dec.feed(stream[i : i + 1])
        if i == len(frames[0]) - 1:
            assert [rid for rid, _ in got] == [1]
        out.extend(got)
    assert [rid for rid, _ in out] == [1, 2]
    assert dec.buffered == 0


def test_empty_payload_is_a_valid_frame() -> None:
    assert FrameDecoder().feed(encode_frame(9, b"")) == [(9, b"")]


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
    as_memoryview=st.booleans(),
)
def test_decoder_reassembles_any_chunking(
    payloads: list[bytes], cuts: list[int], as_memoryview: bool
) -> None:
    stream = b"".join(encode_frame(i + 1, p) for i, p in enumerate(payloads))
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    dec = FrameDecoder()
    out = []
    for a, b in itertools.pairwise(points):
        chunk = stream[a:b]
        out.extend(dec.feed(memoryview(chunk) if as_memoryview else chunk))
    assert out == [(i + 1, p) for i, p in enumerate(payloads)]
    assert dec.buffered == 0


def test_oversized_length_prefix_raises_before_the_body_arrives() -> None:
    dec = FrameDecoder(max_frame_bytes=1024)
    header = struct.pack("<IQ", 1025, 5)
    with pytest.raises(FrameTooLarge) as info:
        dec.feed(header)  # no body at all: refused on the header alone
    assert info.value.code == ErrorCode.BUFFER_OVERFLOW
    assert info.value.request_id == 5
    # The stream has lost its boundaries: the decoder stays failed.
    with pytest.raises(FrameTooLarge):
        dec.feed(encode_frame(6, b"ok"))


def test_frame_at_exactly_the_limit_is_accepted() -> None:
    dec = FrameDecoder(max_frame_bytes=108)
    assert dec.feed(encode_frame(1, b"x" * 100)) == [(1, b"x" * 100)]


@pytest.mark.parametrize("length", [0, 1, 7])
def test_length_prefix_shorter_than_the_id_is_a_frame_error(length: int) -> None:
    dec = FrameDecoder()
    with pytest.raises(FrameError) as info:
        dec.feed(struct.pack("<I", length))
    assert info.value.code == ErrorCode.INVALID_PARAMS
    assert info.value.request_id is None


def test_encoder_refuses_a_message_over_its_limit_without_side_effects() -> None:
    enc = FrameEncoder(max_frame_bytes=64)
    with pytest.raises(FrameTooLarge) as info:
        enc.encode(3, Point(1, "x" * 100))
    assert info.value.limit == 64
    assert enc.encode(4, Point(1, "x"))  # still usable


@pytest.mark.parametrize("limit", [0, 7, 1 << 32, "64MiB"])
def test_invalid_limits_are_refused(limit: object) -> None:
    with pytest.raises(InvalidParams):
        FrameDecoder(max_frame_bytes=limit)  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        FrameEncoder(max_frame_bytes=limit)  # type: ignore[arg-type]


def test_default_limit_is_64_mib() -> None:
    assert DEFAULT_MAX_FRAME_BYTES == 64 << 20
    assert FrameDecoder().max_frame_bytes == 64 << 20


def test_error_reply_message_is_truncated_to_fit_its_schema() -> None:
    frame = FrameEncoder().encode_error(1, -1, "m" * 10_000)
    [(_, payload)] = FrameDecoder().feed(frame)
    assert len(msgspec.msgpack.decode(payload, type=ErrorReply).message) == 4096


def test_frames_before_a_break_in_the_same_chunk_are_returned_then_the_break_raises() -> None:
    dec = FrameDecoder(max_frame_bytes=1024)
    chunk = encode_frame(1, b"a") + encode_frame(2, b"b") + struct.pack("<IQ", 5000, 3)
    assert dec.feed(chunk) == [(1, b"a"), (2, b"b")]
    assert isinstance(dec.error, FrameTooLarge)
    assert dec.error.request_id == 3
    with pytest.raises(FrameTooLarge):
        dec.feed(encode_frame(4, b"d"))


def test_a_sound_stream_has_no_error() -> None:
    dec = FrameDecoder()
    dec.feed(encode_frame(1, b"x")[:5])
    assert dec.error is None


@pytest.mark.parametrize(
    "bad", [struct.pack("<I", 3) + b"\0" * 8, struct.pack("<IQ", 1 << 31, 5)], ids=["short", "big"]
)
def test_a_broken_stream_leaves_no_cycle_behind(bad: bytes) -> None:
    """The recorded break carries no traceback (which would hold feed's frame, the decoder and
    the chunk: a cycle that a server running gc.freeze() never frees), before or after later
    feeds raise it again; the decoder and its chunk go by reference counting alone."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        dec = FrameDecoder(1 << 20)
        with pytest.raises(FrameError) as first:
            dec.feed(bad)
        assert dec.error is not None and dec.error.__traceback__ is None
        with pytest.raises(FrameError) as again:
            dec.feed(b"more")
        assert again.value is not dec.error and dec.error.__traceback__ is None
        assert type(again.value) is type(first.value) and str(again.value) == str(dec.error)
        del dec, first, again
        assert gc.collect() == 0
    finally:
        if was_enabled:
            gc.enable()


def test_frames_before_a_break_are_returned_and_the_break_kept_untraced() -> None:
    enc = FrameEncoder()
    dec = FrameDecoder()
    frames = dec.feed(enc.encode(1, [1]) + struct.pack("<I", 3))
    assert [rid for rid, _ in frames] == [1]
    assert dec.error is not None and dec.error.__traceback__ is None
