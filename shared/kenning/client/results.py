"""Waiting for instances to finish: a client's one LISTEN connection, shared by all its
waiters, woken by the ids the finishing statements NOTIFY (``CHANNEL_RESULTS``).

A waiter registers its instance, makes sure the connection listens, then reads the
instance's row: a notification sent after that read is seen, one sent before it is not
needed. A client that starts an instance while its connection listens skips that first
read (``expect``): the instance cannot finish before it was inserted, so, unless the
connection was lost meanwhile, its notification reaches the client, before or after
``result()`` begins to wait. A waiter reads again when its id is notified, when the
connection was lost (everything sent meanwhile was missed: every waiter reads again once
it is back) and every ``poll_interval`` seconds as a fallback (a notification that never
came). The connection is opened by the first wait and kept until ``close()``: every
NOTIFY in the database costs each listening backend a transaction, but opening it per
wait would cost a connection and a LISTEN each time. While no client listens, the
finishing statements send no NOTIFY at all (``storage.results.results_listen``).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import structlog

from kenning.core.cancelling import cancel_and_wait, wait_until_set
from kenning.core.database_urls import libpq_url
from kenning.core.records import TERMINAL_STATUSES, InstanceRow
from kenning.db import Executor
from kenning.storage import results as results_sql

_log = structlog.get_logger("kenning.results")

T = TypeVar("T")

# seconds between a waiter's reads when no notification wakes it
DEFAULT_POLL_INTERVAL = 1.0
# instances started by a client and not yet awaited, remembered so that result() need
# not read first; beyond this many the oldest are forgotten (their result() reads first)
EXPECTED_LIMIT = 10_000


class ResultWaits:
    def __init__(
        self,
        database_url: str,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self._url = libpq_url(database_url)
        # libpq's keepalives (``Database.client_parameters``): a silent path ends the
        # connection, which is made again, rather than leaving the waits deaf
        self._parameters = dict(parameters or {})
        self.poll_interval = poll_interval
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._generation = 0  # connections made so far: one that was lost may have missed notifications
        # instance id -> (the connection's generation when it was started, notified since)
        self._expected: OrderedDict[str, tuple[int, bool]] = OrderedDict()
        self.backend_pid: int | None = None  # the listening backend, for tests and operators

    @property
    def listening(self) -> bool:
        """Whether the connection listens now (notifications reach the waiters)."""
        return self._listening.is_set()

    @property
    def waiting(self) -> int:
        """Callers waiting now."""
        return sum(len(waiting) for waiting in self._waiters.values())

    def expect(self, instance_id: str) -> None:
        """The client is about to insert this instance: if the connection listens now,
        remember it, so ``until_finished`` need not read before the notification."""
        if not self._listening.is_set():
            return
        self._expected[instance_id] = (self._generation, False)
        if len(self._expected) > EXPECTED_LIMIT:
            self._expected.popitem(last=False)

    def forget(self, instance_id: str) -> None:
        """The insert did not create it (it existed already, or failed)."""
        self._expected.pop(instance_id, None)

    async def until_finished(
        self, instance_id: str, read: Callable[[], Awaitable[InstanceRow]], timeout: float | None
    ) -> InstanceRow | None:
        """The instance's row once it is finished (``read`` reads it); when ``timeout``
        seconds ran out first, the last row read (unfinished), None if none was."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        woken = asyncio.Event()
        self._waiters.setdefault(instance_id, set()).add(woken)
        expected = self._expected.pop(instance_id, None)
        # started while listening, on this same connection, and not notified yet: it has
        # not finished, and it will be notified
        unfinished = expected is not None and expected == (self._generation, False) and self._listening.is_set()
        row: InstanceRow | None = None
        try:
            if not unfinished:
                await self._listen(deadline)
            while True:
                if not unfinished:
                    woken.clear()  # a notification from now on calls for another read
                    row = await read()
                    if row.status in TERMINAL_STATUSES:
                        return row
                unfinished = False
                wait = self.poll_interval if deadline is None else min(self.poll_interval, deadline - loop.time())
                if wait <= 0:
                    return row
                await wait_until_set(woken, wait)
        finally:
            waiting = self._waiters.get(instance_id)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiters[instance_id]

    async def until(
        self, instance_id: str, read: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout: float | None
    ) -> T | None:
        """What ``read`` reads once ``done`` says so, read again whenever ``instance_id`` is
        notified (a reply to a request, its end: ``kenning.storage.replies``), when the
        connection was lost and every ``poll_interval`` seconds; when ``timeout`` seconds
        ran out first, the last read (None if none was)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        woken = asyncio.Event()
        self._waiters.setdefault(instance_id, set()).add(woken)
        last: T | None = None
        try:
            await self._listen(deadline)
            while True:
                woken.clear()  # a notification from now on calls for another read
                last = await read()
                if done(last):
                    return last
                wait = self.poll_interval if deadline is None else min(self.poll_interval, deadline - loop.time())
                if wait <= 0:
                    return last
                await wait_until_set(woken, wait)
        finally:
            waiting = self._waiters.get(instance_id)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiters[instance_id]

    @asynccontextmanager
    async def watching(self, instance_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set whenever ``instance_id`` is notified (a stream entry, its end),
        when the connection was lost, and by nobody else: clear it, read, then wait on it
        (at most ``poll_interval`` at a time). The connection listens before this yields
        (or one poll interval went by), so a notification after the first read is seen."""
        woken = asyncio.Event()
        self._waiters.setdefault(instance_id, set()).add(woken)
        try:
            await self._listen(None)
            yield woken
        finally:
            waiting = self._waiters.get(instance_id)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiters[instance_id]

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _listen(self, deadline: float | None) -> None:
        """Start the listening connection if it is not running; wait until it listens,
        for at most one poll interval (the deadline's remainder if sooner): a database
        that does not answer is not waited for, the reads then poll."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="kenning-results-listener")
        if self._listening.is_set():
            return
        limit = self.poll_interval
        if deadline is not None:
            limit = min(limit, max(0.0, deadline - asyncio.get_running_loop().time()))
        await wait_until_set(self._listening, limit)

    def _wake(self, payload: str) -> None:
        try:
            ids = json.loads(payload)
        except ValueError:
            ids = None
        if not isinstance(ids, list) or None in ids:  # an id too long for a payload: everyone reads
            self._wake_all()
            return
        for instance_id in ids:
            for woken in self._waiters.get(instance_id, ()):
                woken.set()
            expected = self._expected.get(instance_id)
            if expected is not None:
                self._expected[instance_id] = (expected[0], True)

    def _wake_all(self) -> None:
        self._expected.clear()  # their result() reads first
        for waiting in self._waiters.values():
            for woken in waiting:
                woken.set()

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, application_name="kenning-results", **self._parameters
                ) as conn:
                    await results_sql.results_listen(Executor(conn))
                    self.backend_pid = conn.info.backend_pid
                    self._generation += 1
                    self._listening.set()
                    delay = 0.1
                    self._wake_all()  # anything sent while it was not listening was missed
                    async for notify in conn.notifies():
                        self._wake(notify.payload)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self._listening.clear()
                self.backend_pid = None
                self._wake_all()  # the reads poll until it is back
                _log.warning("results.listener_disconnected", error=repr(error), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
