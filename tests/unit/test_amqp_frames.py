"""The AMQP source's lenient frame decoding (``kenning_ingress.sources.amqp_frames``), on
frames built here: what RabbitMQ passes on unchecked and pamqp cannot decode. The source's
behaviour with such messages, through RabbitMQ, is in ``test_sources_amqp.py``."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import aiormq.connection
import pamqp.frame
import pytest
from pamqp import commands, constants
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ContentHeader

from kenning_ingress.sources import amqp_frames


class FarTimestamp(datetime):
    def timestamp(self) -> float:
        return float(2**63)  # no datetime holds it: pamqp's decode raises


def content_header(properties: commands.Basic.Properties, body_size: int = 5, channel: int = 3) -> bytes:
    return pamqp.frame.marshal(ContentHeader(body_size=body_size, properties=properties), channel)


def stand_in(raw: bytes) -> tuple[int, int, ContentHeader]:
    consumed, channel, frame = amqp_frames.lenient_unmarshal(raw)
    assert isinstance(frame, ContentHeader)
    return consumed, channel, frame


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (
            content_header(commands.Basic.Properties(timestamp=FarTimestamp(2000, 1, 1, tzinfo=UTC))),
            "year 292278994 is out of range",
        ),
        (
            content_header(commands.Basic.Properties(content_type="AB")).replace(b"\x02AB", b"\x02\xff\xfe"),
            "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
        ),
    ],
    ids=["timestamp", "not-utf-8"],
)
def test_a_content_header_that_does_not_decode_becomes_a_stand_in_with_its_body_size_and_the_reason(
    raw: bytes, reason: str
) -> None:
    with pytest.raises(UnmarshalingException):
        amqp_frames._strict(raw)  # what aiormq's reader died of
    consumed, channel, frame = stand_in(raw)
    assert (consumed, channel, frame.body_size) == (len(raw), 3, 5)  # the body frames are read as ever
    assert amqp_frames.undecodable_reason(frame.properties.headers) == reason


def test_a_header_that_decodes_and_other_frames_are_pamqps_own() -> None:
    raw = content_header(commands.Basic.Properties(headers={amqp_frames.UNDECODABLE_HEADER: "forged"}))
    _, _, frame = stand_in(raw)
    assert frame.properties.headers == {amqp_frames.UNDECODABLE_HEADER: "forged"}
    assert amqp_frames.undecodable_reason(frame.properties.headers) is None  # a plain str is no reason
    # a broken frame is not one message's fault: it still ends the connection
    broken = content_header(commands.Basic.Properties())[:-1] + b"x"
    with pytest.raises(UnmarshalingException, match="Last byte error"):
        amqp_frames.lenient_unmarshal(broken)
    method = pamqp.frame.marshal(commands.Basic.Deliver("AB", 7, False, "", "q"), 1)
    assert method[0] == constants.FRAME_METHOD
    with pytest.raises(UnmarshalingException, match="utf-8"):
        amqp_frames.lenient_unmarshal(method.replace(b"\x02AB", b"\x02\xff\xfe"))


def test_install_replaces_the_function_aiormq_calls_for_each_frame() -> None:
    # aiormq looks ``pamqp.frame.unmarshal`` up on each frame; were it to import the name,
    # the wrapper would no longer be called, and this says so before a hostile message does
    assert "pamqp.frame.unmarshal(" in inspect.getsource(aiormq.connection.FrameReceiver)
    original = pamqp.frame.unmarshal
    try:
        amqp_frames.install()
        amqp_frames.install()
        assert pamqp.frame.unmarshal is amqp_frames.lenient_unmarshal
    finally:
        pamqp.frame.unmarshal = original
