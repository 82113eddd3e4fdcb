"""Group commit for the ingress: requests that arrive while an inbox insert is in flight
are stored together by the next one.

One statement and one commit then carry many requests' events, so under load the cost
per event falls to a share of a round trip, and a lone request still goes out at once
(nothing waits for a batch to fill). Every request is answered only after the statement
that holds its events has committed, exactly as if it had been inserted alone; within a
batch, a second copy of an event is a duplicate, as it would be one request later.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog

from kenning.storage.inbox import NewEvent

_log = structlog.get_logger("kenning.ingress")

Insert = Callable[[Sequence[NewEvent]], Awaitable[list[bool]]]
IsolatesFailure = Callable[[BaseException], bool]


@dataclass
class _Request:
    events: Sequence[NewEvent]
    answer: asyncio.Future[list[bool]]


@dataclass
class InboxBatcher:
    """Batches ``store`` calls into ``insert`` calls, at most ``max_in_flight`` at once
    and at most ``max_events`` events each (a request is never split).

    When a batch of several requests fails and ``retry_alone(error)`` says the error may
    belong to one request (bad data, not an unreachable database), each request is
    inserted again on its own, so one bad request cannot fail the others.
    """

    insert: Insert
    retry_alone: IsolatesFailure
    max_events: int = 500
    max_in_flight: int = 1
    _queue: deque[_Request] = field(default_factory=deque)
    _in_flight: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def store(self, events: Sequence[NewEvent]) -> list[bool]:
        """Per event, whether it was stored (False: a duplicate); raises what the insert raised."""
        request = _Request(events, asyncio.get_running_loop().create_future())
        self._queue.append(request)
        if self._in_flight < self.max_in_flight:
            self._in_flight += 1
            # its own task: a request cancelled while waiting must not cancel the
            # statement that carries other requests' events
            task = asyncio.create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await request.answer

    def _next_batch(self) -> list[_Request]:
        batch: list[_Request] = []
        size = 0
        while self._queue and (not batch or size + len(self._queue[0].events) <= self.max_events):
            request = self._queue.popleft()
            batch.append(request)
            size += len(request.events)
        return batch

    async def _drain(self) -> None:
        try:
            while self._queue:
                await self._flush(self._next_batch())
        finally:
            self._in_flight -= 1

    async def _flush(self, batch: list[_Request]) -> None:
        try:
            stored = await self.insert([event for request in batch for event in request.events])
        except BaseException as error:
            if isinstance(error, Exception) and len(batch) > 1 and self.retry_alone(error):
                _log.info("inbox.batch_retried_alone", requests=len(batch), error=repr(error))
                for request in batch:
                    await self._flush([request])
                return
            for request in batch:
                _answer_error(request, error)
            if not isinstance(error, Exception):
                raise  # cancelled at shutdown: the requests were answered with the error
            return
        position = 0
        for request in batch:
            _answer(request, stored[position : position + len(request.events)])
            position += len(request.events)


def _answer(request: _Request, stored: list[bool]) -> None:
    if not request.answer.done():  # the request may have been cancelled (client gone)
        request.answer.set_result(stored)


def _answer_error(request: _Request, error: BaseException) -> None:
    if not request.answer.done():
        request.answer.set_exception(error)
