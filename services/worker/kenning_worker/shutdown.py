"""The bound on a worker's exit after SIGTERM: grace period + ``MARGIN_SECONDS``.

Two things can keep a process alive past its worker's drain: a sync activity stuck in
its thread (a thread cannot be killed, and both ``asyncio.Runner`` and the interpreter
join executor threads at exit) and a run that ignores its cancellation (the runner waits
for every task it cancels). So the process runs sync activities on an executor of its
own, whose threads it can see; once the worker has released what it could, it exits at
once with ``os._exit`` if any of those threads or runs is left. A watchdog thread, armed
by the first SIGTERM, does the same at grace + margin whatever the event loop is doing
(an ``async`` activity that blocks the loop with ``time.sleep`` included). Either way
the exit code is 0, as for any SIGTERM: the instances left behind were released, or
their leases expire and another worker takes them over.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

_log = structlog.get_logger("kenning.worker")

MARGIN_SECONDS = 5.0  # past the grace period: cancelling, releasing, closing connections
THREAD_PREFIX = "kenning-sync-activity"  # not the daemon threads of timed activities
_THREADS_END_SECONDS = 0.5  # idle executor threads end at once when shut down


class ExitBound:
    def __init__(self, grace_seconds: float, margin_seconds: float = MARGIN_SECONDS) -> None:
        self.limit = grace_seconds + margin_seconds
        self.executor = ThreadPoolExecutor(thread_name_prefix=THREAD_PREFIX)
        self._watchdog: threading.Timer | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run ``asyncio.to_thread`` (sync activities) on threads this bound can see."""
        loop.set_default_executor(self.executor)

    def arm(self) -> None:
        """On the first SIGTERM: the process exits within the limit, whatever happens."""
        if self._watchdog is not None:
            return
        self._watchdog = threading.Timer(self.limit, self._expired)
        self._watchdog.daemon = True  # does not keep a process that finished in time
        self._watchdog.start()

    def _expired(self) -> None:
        exit_now("shutdown exceeded the grace period", limit_seconds=self.limit)

    async def finish(self, *, abandoned_runs: int) -> None:
        """After the worker stopped: exit at once if an activity thread or a run is still
        going (waiting for them is what the bound rules out); otherwise return and let the
        process end normally."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + _THREADS_END_SECONDS
        busy = _activity_threads()
        while busy and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            busy = _activity_threads()
        if busy or abandoned_runs:
            exit_now("activities still running", activity_threads=len(busy), abandoned_runs=abandoned_runs)
        if self._watchdog is not None:
            self._watchdog.cancel()


def _activity_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and not t.daemon and t.is_alive()]


def exit_now(reason: str, **fields: Any) -> None:
    """End the process now, without waiting for threads or tasks: code 0 (a stop)."""
    _log.warning("worker.exit_forced", reason=reason, **fields)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream: nothing to lose
            pass
    os._exit(0)
