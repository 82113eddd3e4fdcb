"""What every broker source does with one message: decode, validate, write, then ack.

A source (``amqp.py``, ``nats.py``) owns its connection and hands each message it receives
to ``Intake.handle`` as a ``Delivery``; the handling is the same for every broker:

1. decode the message in its protocol binding into one event and validate it with the
   HTTP path's own rules and limits (``kenning_ingress.parsing``; a body over HTTP's
   ``--max-body-bytes`` is refused first), so the error texts are the same. A message that
   cannot be taken, whatever the reason (an error the decoding did not foresee included:
   one message must never stop a source), is rejected to the broker's dead-letter
   mechanism once, with one warning line carrying the error and no traceback, counted as
   ``rejected``, and the next message goes on;
2. write the event to the inbox through the ingress's group commit, exactly as a request's
   events (deduplicated by ``(source, id)``);
3. ack only once the inbox row is committed. A crash between the two leaves the message
   with the broker, which delivers it again; the insert then finds the row and stores
   nothing (docs/architecture.md invariants 4 and 6: nothing accepted is lost, a
   duplicate is stored once).

While the database is away nothing is acked: each message waits ``RETRY_SECONDS`` and is
handed back to the broker for redelivery, with one warning line per ``WARN_EVERY_SECONDS``.
The broker's own bound (prefetch, max ack pending) caps what one process holds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import structlog

from kenning.observability import tracing
from kenning.observability.faults import fault_point
from kenning.observability.metrics import SOURCE_MESSAGES, SOURCE_SETTLE_FAILURES
from kenning.storage.inbox import NewEvent
from kenning_ingress import responses
from kenning_ingress.parsing import EventLimits, InvalidEventError

_log = structlog.get_logger("kenning.ingress.source")

RETRY_SECONDS = 1.0  # a message the database could not take waits this long before going back
WARN_EVERY_SECONDS = 10.0
RECONNECT_SECONDS = 2.0  # after a lost or refused broker connection

Store = Callable[[Sequence[NewEvent]], Awaitable[list[bool]]]


def error_text(exc: BaseException) -> str:
    """An exception for a log line: its type and what it says (some say nothing)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text and type(exc).__name__ not in text else text or repr(exc)


class Delivery(Protocol):
    """One message as its broker delivered it."""

    def body_size(self) -> int:
        """Bytes in the message's body (its payload)."""
        ...

    def decode(self, limits: EventLimits) -> NewEvent:
        """The message's event in its protocol binding; raises ``InvalidEventError``."""
        ...

    async def ack(self) -> None:
        """Done with: the broker forgets it."""
        ...

    async def reject(self, error: str, error_type: str) -> None:
        """Malformed: to the broker's dead-letter mechanism, never delivered again."""
        ...

    async def release(self) -> None:
        """Not taken now: the broker delivers it again (to this process or another)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Fields naming the message in log lines (delivery tag, stream sequence, ids)."""
        ...


def _described(delivery: Delivery) -> dict[str, Any]:
    """``delivery.describe()``, or nothing when a hostile message's fields do not read."""
    try:
        return delivery.describe()
    except Exception as exc:
        return {"describe_error": error_text(exc)}


class Intake:
    """The handling of one source's messages (``handle``), whatever the broker."""

    def __init__(self, name: str, store: Store, limits: EventLimits, max_body_bytes: int) -> None:
        self.name = name  # the source's URL, password redacted
        self._store = store
        self._limits = limits
        self._max_body_bytes = max_body_bytes  # HTTP's --max-body-bytes
        self._away_since: float | None = None  # the database failed a write and none has succeeded since
        self._warned_at = 0.0
        self.stored = 0  # events written (duplicates included), for logs and tests

    async def handle(self, delivery: Delivery) -> None:
        """Decode, validate, write, ack (or reject, or hand back); never raises but on cancellation."""
        try:
            event = self._decode(delivery)
        except InvalidEventError as invalid:
            await self._reject(delivery, str(invalid), invalid.error_type)
            return
        spans = tracing.ingress_spans([event], {})
        try:
            (stored,) = await self._store([event])
        except Exception as exc:
            tracing.end_spans(spans, exc)
            await self._not_stored(delivery, event, exc)
            return
        tracing.end_spans(spans)
        self._database_back()
        self.stored += 1
        SOURCE_MESSAGES.labels(self.name, "stored").inc()
        # the crash a test provokes here: the row committed, the broker not yet told
        fault_point("source.after_commit")
        await self._settle("ack", delivery.ack, delivery)
        _log.debug("source.event_stored", source=self.name, event_source=event.source, id=event.event_id, new=stored)

    def _decode(self, delivery: Delivery) -> NewEvent:
        """The delivery's event, or ``InvalidEventError`` for anything that stops it."""
        size = delivery.body_size()
        if size > self._max_body_bytes:  # HTTP answers 413; the broker had room for it
            raise InvalidEventError(
                f"message body over {self._max_body_bytes} bytes (--max-body-bytes)", "payload_too_large"
            )
        try:
            return delivery.decode(self._limits)
        except InvalidEventError:
            raise
        except Exception as exc:
            # a message the bindings did not foresee: still the message's fault for this
            # source, which must go on (the error's type and text name it in the log line)
            raise InvalidEventError(f"the message cannot be read: {error_text(exc)}", "invalid_message") from exc

    async def _reject(self, delivery: Delivery, error: str, error_type: str) -> None:
        SOURCE_MESSAGES.labels(self.name, "rejected").inc()
        _log.warning(
            "source.message_rejected", source=self.name, error=error, error_type=error_type, **_described(delivery)
        )
        await self._settle("reject", lambda: delivery.reject(error, error_type), delivery)

    async def _not_stored(self, delivery: Delivery, event: NewEvent, exc: Exception) -> None:
        # the HTTP path's answer to the same failure decides: its 400 is the event's fault
        # (a value PostgreSQL refuses), its 503 the database's, anything else a bug
        response, unexpected = responses.failure(exc)
        answer = json.loads(bytes(response.body))
        if response.status_code == 400:
            await self._reject(delivery, answer["error"], answer["error_type"])
            return
        if unexpected:
            _log.error("source.internal_error", source=self.name, error=repr(exc), exc_info=exc, **_described(delivery))
        else:
            self._database_away(answer["error"], exc)
        # held this long, then handed back: the broker keeps it and nothing spins
        SOURCE_MESSAGES.labels(self.name, "released").inc()
        await asyncio.sleep(RETRY_SECONDS)
        await self._settle("release", delivery.release, delivery)

    async def _settle(self, action: str, settle: Callable[[], Awaitable[None]], delivery: Delivery) -> None:
        """Tell the broker what became of a message. The connection or channel may have
        gone meanwhile (a network cut, a broker restart, a deleted queue): the broker then
        still holds the message and delivers it again, which costs a duplicate the inbox
        stores once (or a second rejection), so this is a warning, not an error."""
        try:
            await settle()
        except Exception as exc:
            SOURCE_SETTLE_FAILURES.labels(self.name, action).inc()
            _log.warning(
                "source.ack_failed",
                source=self.name,
                action=action,
                error=error_text(exc),
                outcome="the broker will redeliver",
                **_described(delivery),
            )

    def _database_away(self, error: str, exc: Exception) -> None:
        now = time.monotonic()
        if self._away_since is None:
            self._away_since = now
        if now - self._warned_at >= WARN_EVERY_SECONDS:
            self._warned_at = now
            _log.warning(
                "source.database_unavailable",
                source=self.name,
                error=error,
                detail=repr(exc),
                seconds=round(now - self._away_since, 1),
                action="not acked: the broker delivers the messages again",
            )

    def _database_back(self) -> None:
        if self._away_since is not None:
            _log.info("source.database_back", source=self.name, seconds=round(time.monotonic() - self._away_since, 1))
            self._away_since = None
            self._warned_at = 0.0
