"""The life of a service process around its loop: signals, health file, drain, closing.

``serve`` is what each long-running process (worker, scheduler, relayer) runs on its
event loop: SIGTERM and SIGINT call the service's ``stop()`` (it stops taking work and
drains what it holds, each service by its own rules), the health file is touched while
the service runs (``kenning.health``), and the database pool is closed however the
service ends. The process's exit code is the command's: 0 after a stop.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol

from kenning.health import heartbeat

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Service(Protocol):
    def stop(self) -> None:
        """Stop taking work; ``run`` drains what is in hand and returns."""

    async def run(self) -> None: ...


async def serve(
    service: Service,
    *,
    close: Callable[[], Awaitable[None]],
    health_file: str = "",
    on_signal: Callable[[], None] | None = None,
) -> None:
    """Run ``service`` until it returns (after a stop signal); then ``close()`` (the
    database pool). ``on_signal``: called first on each stop signal (the worker arms the
    bound on its exit there)."""
    loop = asyncio.get_running_loop()

    def stop() -> None:
        if on_signal is not None:
            on_signal()
        service.stop()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    try:
        async with heartbeat(health_file):
            await service.run()
    finally:
        await close()
