"""``PassLoop``: the loop every Kenning service runs, around the one pass it supplies.

A service (the worker's claims, its inbox, the scheduler, the relayer) does its work in
passes: claim and start what is due, fire what is due, publish what is due. The pass
returns how long until it should run again: 0 when more is due at once (a full batch),
otherwise until the next due time it knows of, capped by the poll interval. The loop runs
it again after that delay, or earlier on a wake-up (a ``NOTIFY`` the service listens
for, see :func:`listening`, or the service's own ``wake()``), until ``stop()``.

A pass that raises (the database is away, mostly) never ends the loop: it logs the
service's event (``scheduler.pass_failed``...) and the pass is retried after
``retry_seconds``, earlier on a wake-up, until the database answers again. The database
being away is a warning (it resolves itself); any other error is a bug every pass will
hit again, so the service does nothing until a person fixes it: an error line
(docs/architecture.md invariant 9), with its traceback the first time it occurs in a row.

Two hooks serve the worker's claim pacing: ``settle`` is a delay after a wake-up before
the next pass, so that wake-ups arriving meanwhile share one pass; ``on_poll`` is called
when the delay ran out with no wake-up (a poll: work may be due that nobody announced).

The process around the loop (signals, health file, drain, closing the pool) is
``kenning.hosting.service``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from kenning.core.cancelling import wait_until_set
from kenning.db.errors import is_unavailable
from kenning.db.listener import Listener

Pass = Callable[[], Awaitable[float]]  # one pass; returns the seconds until the next (0: at once)


class PassLoop:
    def __init__(
        self,
        run_pass: Pass,
        *,
        log: Any,
        failed_event: str,
        retry_seconds: float,
        settle: Callable[[], float] | None = None,
        on_poll: Callable[[], None] | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        self._run_pass = run_pass
        self._log = log
        self._failed_event = failed_event
        self._retry_seconds = retry_seconds
        self._settle = settle
        self._on_poll = on_poll
        self._wake = wake or asyncio.Event()  # ``wake``: an event the service sets itself too
        self._stopping = asyncio.Event()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def stopped(self) -> None:
        """Wait until ``stop()`` was called (a pass in flight may race its drain with it)."""
        await self._stopping.wait()

    def wake(self) -> None:
        """Run the next pass now (or once the one in flight ends)."""
        self._wake.set()

    def stop(self) -> None:
        """Let the pass in flight end, then return from ``run``."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        failing = ""  # the error of the passes failing in a row, if any
        while not self._stopping.is_set():
            self._wake.clear()  # a wake-up from now on calls for another pass
            try:
                delay = await self._run_pass()
                failing = ""
            except Exception as error:  # keep trying, never crash the loop
                if is_unavailable(error):
                    self._log.warning(self._failed_event, error=repr(error), unavailable=True)
                else:
                    again, failing = repr(error) == failing, repr(error)
                    self._log.error(self._failed_event, error=failing, unavailable=False, exc_info=not again)
                delay = self._retry_seconds
            if delay <= 0:
                continue
            if not await wait_until_set(self._wake, delay):
                if self._on_poll is not None:
                    self._on_poll()
                continue
            if self._settle is not None and not self._stopping.is_set():
                await asyncio.sleep(self._settle())


@contextlib.asynccontextmanager
async def listening(
    database_url: str,
    channels: Sequence[str],
    on_notify: Callable[[str], None],
    *,
    enabled: bool = True,
    connected_within: float = 0.0,
    parameters: Mapping[str, Any] | None = None,
) -> AsyncIterator[None]:
    """``LISTEN`` on ``channels`` while the block runs, calling ``on_notify(channel)``
    (nothing if not ``enabled``: the loop polls only). ``connected_within``: wait up to
    that long for the first connection (a database that does not answer yet is no error:
    the pass loop's polls retry it). ``parameters``: libpq's, ``Database.client_parameters``."""
    if not enabled:
        yield
        return
    listener = Listener(database_url, channels, on_notify, parameters)
    await listener.start()
    try:
        if connected_within > 0:
            await wait_until_set(listener.connected, connected_within)
        yield
    finally:
        await listener.stop()
