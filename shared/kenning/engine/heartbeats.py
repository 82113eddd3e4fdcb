"""One activity attempt's heartbeat: ``ctx.heartbeat(details)`` and the watch on it.

``AttemptHeartbeat.watch`` runs the attempt inside a deadline that every heartbeat moves
(``asyncio.Timeout.reschedule``): with ``@activity(heartbeat_timeout=...)``, an attempt
that stops heartbeating is cancelled in this process as soon as the deadline passes and
fails with ``HeartbeatTimeoutError``, long before its lease would tell another worker.

The details are made durable through the port (``RecordHeartbeat``, the step's entry of
the instance's ``attempts``): the first heartbeat at once, later ones at most every
``write_interval`` seconds (the latest wins), and what is not yet written when a failed
attempt ends is written before the attempt is counted, so the next attempt, here or on
another worker after a crash, reads it in ``ctx.heartbeat_details``. A write that fails
is logged and the attempt goes on: a heartbeat is a checkpoint, not a step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from kenning import serialization
from kenning.context import current_heartbeat
from kenning.core.cancelling import cancel_and_wait
from kenning.engine.commands import RecordHeartbeat
from kenning.engine.port import InstancePort
from kenning.errors import HeartbeatTimeoutError

T = TypeVar("T")

# At most one durable write of an attempt's details per this many seconds.
WRITE_INTERVAL = 3.0

_log = structlog.get_logger("kenning.replay")
_UNWRITTEN = object()  # no heartbeat yet


class AttemptHeartbeat:
    """The heartbeat of one attempt of ``step_id`` (``kenning.context.Heartbeat``)."""

    def __init__(
        self,
        *,
        port: InstancePort,
        instance_id: str,
        step_id: str,
        activity_name: str,
        previous: Any,
        timeout: float | None,
        is_async: bool,
        write_interval: float = WRITE_INTERVAL,
    ) -> None:
        self._port = port
        self._instance_id = instance_id
        self._step_id = step_id
        self._name = activity_name
        self._previous = previous
        self._timeout = timeout
        self._is_async = is_async
        self._write_interval = write_interval
        self._loop = asyncio.get_running_loop()
        self._scope: asyncio.Timeout | None = None
        self._closed = False
        self._latest: Any = _UNWRITTEN
        self._beats = 0  # heartbeats so far; _written_beat: the last one made durable
        self._written_beat = 0
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._writing = False

    @property
    def previous_details(self) -> Any:
        return self._previous

    @property
    def beaten(self) -> bool:
        """Whether the attempt heartbeated at all."""
        return self._latest is not _UNWRITTEN

    @property
    def latest_details(self) -> Any:
        """What the next attempt reads: this attempt's last details, else the earlier ones."""
        return self._previous if self._latest is _UNWRITTEN else self._latest

    def beat(self, details: Any) -> None:
        stored = serialization.storable_json(details, f"activity {self._name}: heartbeat details")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # a sync activity's thread
            running = None
        if running is self._loop:
            self._beaten(stored)
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody watches any more
                self._loop.call_soon_threadsafe(self._beaten, stored)

    def _beaten(self, stored: Any) -> None:
        if self._closed:  # an abandoned sync attempt still beating
            return
        self._latest = stored
        self._beats += 1
        if self._scope is not None and self._timeout is not None:
            self._scope.reschedule(self._loop.time() + self._timeout)
        self._wake.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop(), name=f"kenning-heartbeat-{self._step_id}")

    async def watch(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run the attempt with this heartbeat as ``ctx``'s, inside its deadline."""
        token = current_heartbeat.set(self)
        failed = True
        try:
            async with asyncio.timeout(self._timeout) as scope:
                self._scope = scope
                result = await attempt()
            failed = False
            return result
        except TimeoutError:
            if not scope.expired():  # the activity's own TimeoutError, or its attempt timeout
                raise
            abandoned = "" if self._is_async else " (its thread keeps running in the background)"
            raise HeartbeatTimeoutError(
                f"activity {self._name} sent no heartbeat for {self._timeout:g} s{abandoned}"
            ) from None
        finally:
            current_heartbeat.reset(token)
            await self._close(write_last=failed)

    async def _close(self, *, write_last: bool) -> None:
        """Stop writing; a failed attempt's unwritten details are written now, before it is
        counted, so the next attempt reads them."""
        self._closed = True
        writer, self._writer = self._writer, None
        if writer is not None:
            if self._writing:
                await writer  # a write in flight ends (the loop stops after it)
            else:
                await cancel_and_wait(writer)
        if write_last and self._beats > self._written_beat:
            await self._write(self._latest, self._beats)

    async def _write_loop(self) -> None:
        while True:  # until closed: cancelled while it sleeps, or ended after a write
            await self._wake.wait()
            self._wake.clear()
            self._writing = True
            try:
                await self._write(self._latest, self._beats)
            finally:
                self._writing = False
            if self._closed:
                return
            await asyncio.sleep(self._write_interval)

    async def _write(self, details: Any, beat: int) -> None:
        try:
            recorded = await self._port.record_heartbeat(RecordHeartbeat(self._step_id, details))
        except Exception as error:  # best effort: the attempt goes on; a later write may land
            _log.warning(
                "activity.heartbeat_not_recorded",
                instance_id=self._instance_id,
                step=self._step_id,
                error=repr(error),
            )
            return
        if recorded:
            self._written_beat = beat
        else:  # another worker holds the instance: this attempt's record will be refused too
            _log.warning("activity.heartbeat_lease_lost", instance_id=self._instance_id, step=self._step_id)
