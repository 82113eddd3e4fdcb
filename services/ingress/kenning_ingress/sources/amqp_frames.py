"""A message whose AMQP properties the client cannot decode arrives as one the source rejects.

aiormq decodes every frame with ``pamqp.frame.unmarshal`` in its connection's reader task.
When a message's content header frame (its properties and headers) does not decode, that
task ends and aiormq closes the connection: an AMQP timestamp, as the ``timestamp``
property or a header, beyond ``datetime``'s year 9999 (any client but Python's can send
one), a short string that is not UTF-8, a table nested past the recursion limit. RabbitMQ
then requeues the delivered message and gives it to the next connection first, so the
source reconnects, receives it and drops again, for ever, and nothing behind it arrives.

The broker cannot bound that for every queue: a quorum queue's ``x-delivery-limit`` would,
but the queue and its arguments are the user's and a classic queue has no limit. aiormq
and aio-pika have no hook for a frame that does not decode, and the message was delivered
(its ``basic.deliver`` decoded), so it can still be rejected if the connection lives. So
``install`` wraps ``pamqp.frame.unmarshal``, which aiormq looks up on each frame: a content
header that fails to decode becomes one with the same body size (its first 12 bytes, which
the framing already checked; aiormq needs it to read the body frames that follow) and no
properties but the header ``UNDECODABLE_HEADER``, holding the reason as an ``Undecodable``.
The delivery then reaches the source like any other and is rejected with that reason
(``undecodable_reason``), once. Any other frame that fails to decode still raises: the
connection is no use then, and no message is to blame.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

import pamqp.frame
from pamqp import commands, constants
from pamqp.header import ContentHeader

UNDECODABLE_HEADER = "x-kenning-undecodable"
_CONTENT_HEADER_START = struct.Struct(">HHQ")  # class id, weight, body size


class Undecodable(str):
    """Why a message's properties did not decode. Its own type, so a publisher's header of
    the same name (decoded as a plain ``str`` or ``bytes``) is never taken for one."""


Unmarshal = Callable[[bytes], tuple[int, int, pamqp.frame.FrameTypes]]
_strict: Unmarshal = pamqp.frame.unmarshal


def lenient_unmarshal(data_in: bytes) -> tuple[int, int, pamqp.frame.FrameTypes]:
    """``pamqp.frame.unmarshal``, but a content header frame that does not decode comes back
    as a stand-in carrying the reason (see the module's docstring)."""
    try:
        return _strict(data_in)
    except Exception as error:
        stand_in = _stand_in(data_in, error)
        if stand_in is None:
            raise
        return stand_in


def _stand_in(data_in: bytes, error: Exception) -> tuple[int, int, ContentHeader] | None:
    frame_type, channel_id, frame_size = pamqp.frame.frame_parts(data_in)
    if frame_type != constants.FRAME_HEADER or frame_size is None or frame_size < _CONTENT_HEADER_START.size:
        return None
    end = constants.FRAME_HEADER_SIZE + frame_size
    if len(data_in) <= end or data_in[end] != constants.FRAME_END:
        return None  # not a whole frame: the framing failed, not the properties
    class_id, _, body_size = _CONTENT_HEADER_START.unpack_from(data_in, constants.FRAME_HEADER_SIZE)
    if class_id != commands.Basic.frame_id:
        return None
    cause = error.__cause__ if isinstance(error.__cause__, Exception) else error
    reason = Undecodable(str(cause) or type(cause).__name__)
    properties = commands.Basic.Properties(headers={UNDECODABLE_HEADER: reason})
    return end + 1, channel_id, ContentHeader(body_size=body_size, properties=properties)


def undecodable_reason(headers: Mapping[str, Any] | None) -> str | None:
    """Why the message's properties did not decode, if they did not."""
    reason = (headers or {}).get(UNDECODABLE_HEADER)
    return str(reason) if isinstance(reason, Undecodable) else None


def install() -> None:
    """Decode content header frames leniently in this process (idempotent)."""
    pamqp.frame.unmarshal = lenient_unmarshal
