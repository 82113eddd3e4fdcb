"""Stopping a background task from another task, without losing the stopper's own
cancellation.

``task.cancel()`` then ``with suppress(CancelledError): await task`` is the usual idiom,
and it swallows a cancellation of the task that awaits too: cancelled while it waits
(``asyncio.run`` ending, a timeout around ``client.close()``), the awaiting task gets
the same ``CancelledError`` as the task it stops, takes it for that task's and runs on.
``Task.cancelling()`` tells the two apart (Python 3.11).
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
