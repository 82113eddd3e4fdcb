"""LISTEN for wake-ups on a dedicated connection; callers poll as a fallback.

Payloads are ignored: a notification only means "look now". After a lost connection
every channel is reported once, since notifications sent meanwhile were missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
import structlog

from kenning.core.database_urls import libpq_url

_log = structlog.get_logger("kenning.listener")


class Listener:
    def __init__(
        self,
        database_url: str,
        channels: Sequence[str],
        on_notify: Callable[[str], None],
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self._url = libpq_url(database_url)
        # libpq's keepalives (``Database.client_parameters``): a path gone silent fails the
        # connection, which is made again, instead of leaving it deaf and never knowing
        self._parameters = dict(parameters or {})
        self._channels = list(channels)
        self._on_notify = on_notify
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kenning-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, **self._parameters
                ) as conn:
                    for channel in self._channels:
                        await conn.execute(f'LISTEN "{channel}"')
                    self.connected.set()
                    delay = 0.1
                    for channel in self._channels:  # anything sent while we were away
                        self._on_notify(channel)
                    async for notify in conn.notifies():
                        self._on_notify(notify.channel)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self.connected.clear()
                _log.warning("listener.disconnected", error=repr(error), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
