"""The life of a service process around its loop: signals, health file, drain, closing.

``serve`` is what each long-running process (worker, scheduler, relayer) runs on its
event loop: SIGTERM and SIGINT call the service's ``stop()`` (it stops taking work and
drains what it holds, each service by its own rules), the health file is touched while
the service runs (``kenning.hosting.health``), and the database pool is closed however the
service ends. The process's exit code is the command's: 0 after a stop.

Before ``serve`` the service starts: it loads its app, migrates, connects (a second or
more). ``Starting`` makes a SIGTERM then a clean stop too (exit code 0), not the signal's
default death (143): the process unwinds from where it was, or, once its event loop is
being set up, ``serve`` returns at once without running the service.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Protocol

from kenning.hosting.health import heartbeat

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Starting:
    """SIGTERM while a service starts. ``Starting.catch()`` comes first in the service's
    ``run``, before anything slow; what came before it (the interpreter's start, the
    command's imports) still dies by the signal: importing ``kenning`` must not take
    SIGTERM from a program that imports it."""

    def __init__(self) -> None:
        self.stop_requested = False
        self._deferred = False

    @classmethod
    def catch(cls) -> Starting:
        starting = cls()
        signal.signal(signal.SIGTERM, starting._on_sigterm)
        starting._hook_unraisable()
        return starting

    def _hook_unraisable(self) -> None:
        """The SIGTERM's SystemExit, raised where the main thread is, may land in a finalizer
        or a weakref callback an import or a collection was running: Python then reports it
        as "Exception ignored" with a traceback and goes on. Nothing is lost (the stop is
        remembered, ``serve`` runs no service), so that report is not printed."""
        default = sys.unraisablehook

        def hook(unraisable: sys.UnraisableHookArgs) -> None:
            if self.stop_requested and issubclass(unraisable.exc_type, SystemExit):
                return
            default(unraisable)

        sys.unraisablehook = hook

    def defer(self) -> None:
        """The event loop is about to start: a SIGTERM from now on is remembered for
        ``serve`` (an exception raised while asyncio builds its loop leaves it half made)."""
        self._deferred = True

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        self.stop_requested = True
        if not self._deferred:
            # raised where the main thread is: what is starting unwinds (finally blocks
            # run, a statement in flight is cancelled, a migration rolls back)
            raise SystemExit(0)


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
    starting: Starting | None = None,
) -> None:
    """Run ``service`` until it returns (after a stop signal); then ``close()`` (the
    database pool). ``on_signal``: called first on each stop signal (the worker arms the
    bound on its exit there). ``starting``: a SIGTERM it remembered means the service is
    not run at all."""
    loop = asyncio.get_running_loop()

    def stop() -> None:
        if on_signal is not None:
            on_signal()
        service.stop()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    try:
        if starting is not None and starting.stop_requested:
            return
        async with heartbeat(health_file):
            await service.run()
    finally:
        await close()
