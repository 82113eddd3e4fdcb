"""What every broker source does with a message the decoding did not foresee
(``kenning_ingress.sources.base.Intake``), whatever the broker: it is rejected once, with
one warning line and one count, and ``handle`` returns for the next one. Through the real
brokers, the hostile messages known to reach that far are in ``test_sources_amqp.py`` and
``test_sources_nats.py``; this is the guard for the ones nobody has thought of yet."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import structlog
from prometheus_client import REGISTRY

from kenning.storage.inbox import NewEvent
from kenning_ingress.parsing import DEFAULT_LIMITS, EventLimits
from kenning_ingress.sources.base import Intake


class Unforeseen:
    """A delivery whose decoding fails with an error no binding raises on purpose (before,
    ``Intake.handle`` let it out: the message was neither acked nor rejected)."""

    def __init__(self, *, describe_fails: bool = False) -> None:
        self.settled: list[tuple[str, ...]] = []
        self.describe_fails = describe_fails

    def body_size(self) -> int:
        return 10

    def decode(self, limits: EventLimits) -> NewEvent:
        raise RecursionError("maximum recursion depth exceeded")  # as a deep enough document could

    async def ack(self) -> None:
        self.settled.append(("ack",))

    async def reject(self, error: str, error_type: str) -> None:
        self.settled.append(("reject", error, error_type))

    async def release(self) -> None:
        self.settled.append(("release",))

    def describe(self) -> dict[str, Any]:
        if self.describe_fails:
            raise KeyError("ce-id")
        return {"delivery_tag": 1}


async def refuse_to_store(events: Sequence[NewEvent]) -> list[bool]:
    raise AssertionError("nothing reaches the inbox")


def rejected_count(source: str) -> float:
    found = REGISTRY.get_sample_value("kenning_source_messages_total", {"source": source, "outcome": "rejected"})
    return found or 0.0


async def test_an_error_the_decoding_did_not_foresee_rejects_the_message_once_and_handle_returns() -> None:
    source = f"test-{uuid.uuid4().hex[:8]}"
    intake = Intake(source, refuse_to_store, DEFAULT_LIMITS, max_body_bytes=1024)
    plain, odd = Unforeseen(), Unforeseen(describe_fails=True)
    with structlog.testing.capture_logs() as logged:
        await intake.handle(plain)
        await intake.handle(odd)
    error = "the message cannot be read: RecursionError: maximum recursion depth exceeded"
    assert plain.settled == odd.settled == [("reject", error, "invalid_message")]
    lines = [line for line in logged if line["event"] == "source.message_rejected"]
    assert [(line["log_level"], line["error"], line["error_type"]) for line in lines] == [
        ("warning", error, "invalid_message")
    ] * 2
    assert lines[0]["delivery_tag"] == 1 and lines[1]["describe_error"] == "KeyError: 'ce-id'"
    assert all("exc_info" not in line for line in logged)  # no traceback
    assert rejected_count(source) == 2


async def test_a_body_over_the_http_limit_is_rejected_before_it_is_decoded() -> None:
    source = f"test-{uuid.uuid4().hex[:8]}"
    intake = Intake(source, refuse_to_store, DEFAULT_LIMITS, max_body_bytes=9)  # the body is 10 bytes
    delivery = Unforeseen()
    await intake.handle(delivery)
    assert delivery.settled == [("reject", "message body over 9 bytes (--max-body-bytes)", "payload_too_large")]
    assert rejected_count(source) == 1
