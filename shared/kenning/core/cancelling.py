"""Stopping a background task from another task, without losing the stopper's own
cancellation.

``task.cancel()`` then ``with suppress(CancelledError): await task`` is the usual idiom,
and it swallows a cancellation of the task that awaits too: cancelled while it waits
(``asyncio.run`` ending, a timeout around ``client.close()``), the awaiting task gets
the same ``CancelledError`` as the task it stops, takes it for that task's and runs on.
``Task.cancelling()`` tells the two apart (Python 3.11).

Waiting for an event with a bound has the same trap: on Python 3.11,
``asyncio.wait_for(event.wait(), timeout)`` returns normally when the event is set in the
loop turn that cancels the waiting task, so the cancellation is lost (a client's
``request`` cancelled as a notification arrived waited out its whole timeout).
``asyncio.timeout`` keeps it: ``wait_until_set`` waits so.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended; a cancellation of the caller meanwhile
    is raised, not swallowed with the task's."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def wait_until_set(event: asyncio.Event, timeout: float) -> bool:
    """Whether ``event`` is set within ``timeout`` seconds; a cancellation of the caller is
    raised, even one that comes in the turn the event is set (module docstring)."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
