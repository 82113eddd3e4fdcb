"""The replay barrier: a new step waits until every recorded step has been replayed.

Concurrent branches (``asyncio.gather``) replay their recorded steps without real awaits,
each when the event loop first runs it. So a branch may reach a step that was never
recorded while a sibling has not yet replayed its own recorded ones. That branch must not
run anything new yet, and it must not be failed either: it *parks* here.

- When the last recorded step is replayed, the parked branches go on, in arrival order.
- When no branch of the run can replay anything any more (every one is parked, finished,
  or blocked on something other than a step), recorded steps are left that the code will
  never reach: the code diverged, and each parked branch raises ``NonDeterminismError``.

The second condition is decided by walking what the run's root task waits on, as
Temporal's workflow loop knows when every coroutine is blocked on a command: a task whose
awaited future is done or that has none is still runnable; ``asyncio.gather`` is followed
into its children; a parked branch is blocked on the engine. The verdict therefore does
not depend on how many loop turns the replay takes. Branches under ``asyncio.TaskGroup``
or ``asyncio.wait`` are not followed (their futures do not name their tasks); they count
as blocked, so use ``asyncio.gather`` for concurrent steps, as Edda does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kenning.errors import NonDeterminismError


class ReplayBarrier:
    def __init__(self, history_drained: Callable[[], bool]) -> None:
        self._drained = history_drained
        self._root: asyncio.Future[Any] | None = None
        self._parked: list[tuple[asyncio.Future[None], Callable[[], NonDeterminismError]]] = []
        self._armed = False

    def enter(self, root: asyncio.Future[Any] | None) -> None:
        """The task that runs the workflow body (the root of every branch)."""
        self._root = root

    async def wait(self, diverged: Callable[[], NonDeterminismError]) -> None:
        """Return once all recorded steps are replayed; raise ``diverged()`` when they
        never will be."""
        if self._drained():
            return
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parked.append((answer, diverged))
        self._arm()
        await answer

    def drained(self) -> None:
        """The last recorded step was replayed: parked branches go on."""
        self._release()

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_soon(self._check)

    def _check(self) -> None:
        self._armed = False
        if not self._parked:
            return
        if self._drained():
            self._release()
        elif self._root is None or branches_blocked(self._root, {f for f, _ in self._parked}):
            parked, self._parked = self._parked, []
            for answer, diverged in parked:
                if not answer.done():
                    answer.set_exception(diverged())
        else:
            self._arm()  # some branch can still run: look again after it did

    def _release(self) -> None:
        parked, self._parked = self._parked, []
        for answer, _ in parked:
            if not answer.done():
                answer.set_result(None)


def branches_blocked(root: asyncio.Future[Any], parked: set[asyncio.Future[None]]) -> bool:
    """Whether nothing under ``root`` can run before something outside it happens."""
    stack: list[asyncio.Future[Any]] = [root]
    seen: set[int] = set()
    while stack:
        future = stack.pop()
        if id(future) in seen or future.done() or future in parked:
            continue
        seen.add(id(future))
        if isinstance(future, asyncio.Task):
            # the future the task's coroutine is suspended on (CPython's Task and its C
            # accelerator both keep it here); None while the task is ready or running
            waiter: asyncio.Future[Any] | None = getattr(future, "_fut_waiter", None)
            if waiter is None or waiter.done():
                return False
            stack.append(waiter)
            continue
        children = getattr(future, "_children", None)  # asyncio.gather's future
        if children is not None:
            stack.extend(children)
        # any other future: blocked outside the engine (a sleep, I/O, an asyncio.Event)
    return True
