"""Liveness for processes without an HTTP port (worker, scheduler, relayer).

A process given ``--health-file`` touches it every few seconds from its event loop;
``kenning healthcheck --file`` (the compose healthcheck) fails once the file is stale,
which catches a dead process and a stuck event loop alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

HEARTBEAT_SECONDS = 5.0


def touch(path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a"):
        os.utime(path, None)


async def _beat(path: str, interval: float) -> None:
    while True:
        await asyncio.to_thread(touch, path)
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def heartbeat(path: str, interval: float = HEARTBEAT_SECONDS) -> AsyncIterator[None]:
    """Touch ``path`` every ``interval`` seconds while the block runs (no-op without a path)."""
    if not path:
        yield
        return
    task = asyncio.create_task(_beat(path, interval), name="kenning-health-file")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(OSError):
            os.unlink(path)
