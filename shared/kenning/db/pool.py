"""psycopg_pool's ``AsyncConnectionPool``, with maintenance workers that end when cancelled.

The pool does its upkeep (opening a connection for it, returning one that needs a reset)
in worker tasks of its own, and a worker catches ``CancelledError`` from the job it runs:
a connect cut short by a cancellation counts as a failed connect (logged, and given up:
``Database`` sets no reconnect time), and the worker waits for its next job. A program
that used a ``Client`` and returned from ``asyncio.run`` without closing it left such a
worker opening a connection (the pool grows while callers wait, and the last of them may
be served by a returned connection first); ``asyncio.run`` cancelled it and then waited
for it for ever, the loop idle with no timer (issue 25, item 9). Here a worker whose task
was cancelled ends once its job returns: psycopg_pool swallows the exception, but the
task still counts the request (``Task.cancelling()``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.pool_async import StopWorker  # what close() sends each worker to end it

# psycopg_pool's logger, for the line its own worker logs for a job that failed
_pool_log = logging.getLogger("psycopg.pool")


class AsyncPool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    @classmethod
    async def worker(cls, q: Any) -> None:
        """psycopg_pool's worker loop, ending when its task was cancelled."""
        task = asyncio.current_task()
        while True:
            job = await q.get()
            if isinstance(job, StopWorker):
                return
            try:
                await job.run()
            except Exception as error:  # one job's failure must not end the pool's upkeep
                _pool_log.warning("task run %s failed: %s: %s", job, type(error).__name__, error)
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
