"""Group commit: writes that arrive while a statement is in flight go out together in
the next one.

One statement and one commit then carry many callers' rows, so under load the cost per
row falls to a share of a round trip, and a lone write still goes out at once (nothing
waits for a batch to fill). Every caller is answered only after the statement holding
its rows has committed, as if it had written alone. The ingress batches inbox inserts
(a request's events stay together); workers batch the fenced step records of the
instances they run.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog

from kenning.observability import metrics

_log = structlog.get_logger("kenning.groupcommit")

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")
IsolatesFailure = Callable[[BaseException], bool]


@dataclass
class _Request(Generic[Item, Outcome]):
    items: Sequence[Item]
    answer: asyncio.Future[list[Outcome]]


@dataclass
class GroupCommit(Generic[Item, Outcome]):
    """Batches ``store`` calls into ``write`` calls (one statement each, returning one
    outcome per item in order), at most ``max_in_flight`` at once and at most
    ``max_items`` items each (one caller's items are never split).

    When a batch of several requests fails and ``retry_alone(error)`` says the error may
    belong to one request (bad data, not an unreachable database), each request is
    inserted again on its own, so one bad request cannot fail the others.
    """

    write: Callable[[Sequence[Item]], Awaitable[list[Outcome]]]
    retry_alone: IsolatesFailure
    max_items: int = 500
    max_in_flight: int = 1
    name: str = "other"  # the writer label of kenning_group_commit_batch_size
    # what it has done, for logs and tests: statements run and items they carried
    statements: int = 0
    items: int = 0
    _queue: deque[_Request[Item, Outcome]] = field(default_factory=deque)
    _in_flight: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def store(self, items: Sequence[Item]) -> list[Outcome]:
        """The outcome of each item; raises what the statement carrying them raised."""
        request: _Request[Item, Outcome] = _Request(items, asyncio.get_running_loop().create_future())
        self._queue.append(request)
        if self._in_flight < self.max_in_flight:
            self._in_flight += 1
            # its own task: a caller cancelled while waiting must not cancel the
            # statement that carries other callers' rows
            task = asyncio.create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await request.answer

    def _next_batch(self) -> list[_Request[Item, Outcome]]:
        batch: list[_Request[Item, Outcome]] = []
        size = 0
        while self._queue and (not batch or size + len(self._queue[0].items) <= self.max_items):
            request = self._queue.popleft()
            batch.append(request)
            size += len(request.items)
        return batch

    async def _drain(self) -> None:
        try:
            while self._queue:
                await self._flush(self._next_batch())
        except BaseException as error:
            # cancelled (shutdown): nobody else may drain what is queued, so answer it
            while self._queue:
                _answer_error(self._queue.popleft(), error)
            raise
        finally:
            self._in_flight -= 1

    async def _flush(self, batch: list[_Request[Item, Outcome]]) -> None:
        items = [item for request in batch for item in request.items]
        self.statements += 1
        self.items += len(items)
        metrics.GROUP_COMMIT_BATCH_SIZE.labels(self.name).observe(len(items))
        try:
            outcomes = await self.write(items)
        except BaseException as error:
            if isinstance(error, Exception) and len(batch) > 1 and self.retry_alone(error):
                _log.info("groupcommit.retried_alone", callers=len(batch), error=repr(error))
                for done, request in enumerate(batch):
                    try:
                        await self._flush([request])
                    except BaseException as interrupted:
                        for waiting in batch[done + 1 :]:
                            _answer_error(waiting, interrupted)
                        raise
                return
            for request in batch:
                _answer_error(request, error)
            if not isinstance(error, Exception):
                raise  # cancelled at shutdown: the requests were answered with the error
            return
        position = 0
        for request in batch:
            _answer(request, outcomes[position : position + len(request.items)])
            position += len(request.items)


def _answer(request: _Request[Item, Outcome], outcomes: list[Outcome]) -> None:
    if not request.answer.done():  # the caller may have been cancelled (client gone)
        request.answer.set_result(outcomes)


def _answer_error(request: _Request[Any, Any], error: BaseException) -> None:
    if not request.answer.done():
        request.answer.set_exception(error)
