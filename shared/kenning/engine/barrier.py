"""The replay barrier: a new step waits until every recorded step has been replayed.

Concurrent branches (``asyncio.gather``) replay their recorded steps without real awaits,
each when the event loop first runs it. So a branch may reach a step that was never
recorded while a sibling has not yet replayed its own recorded ones. That branch must not
run anything new yet, and it must not be failed either: it *parks* here.

- When the last recorded step is replayed, the parked branches go on, in arrival order.
- When no branch of the run can replay anything any more (every one is parked at a new
  step or finished), recorded steps are left that the code will never reach: the code
  diverged, and each parked branch raises ``NonDeterminismError``.

The second condition is decided by walking what the run's root task waits on, as
Temporal's workflow loop knows when every coroutine is blocked on a command: a task whose
awaited future is done or that has none is still runnable (looked at again a loop turn
later); ``asyncio.gather`` is followed into its children; a parked branch is blocked on
the engine. The verdict therefore does not depend on how many loop turns the replay takes.

Any other future a branch waits on is outside the engine (a sleep or I/O in a hook run
while replaying, ``asyncio.wait_for`` or ``shield`` around a gather, a ``TaskGroup``'s
or ``asyncio.wait``'s own future): nothing is decided while one is pending, and the walk
is made again when it completes. So such a wait never fails a deterministic workflow;
what it costs is that branches behind such a future are not seen (those futures do not
name their tasks): a divergence there is decided only once the future completes, which
for a ``TaskGroup`` whose branch is parked is never (the run then waits until its lease
is taken or it is cancelled). A branch started with bare ``asyncio.create_task`` that
the root does not await is not seen either: if the root parks before such a task has
replayed its steps, the verdict can come too early. Use ``asyncio.gather`` for
concurrent steps, as Edda does.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Any

from kenning.errors import NonDeterminismError


class ReplayBarrier:
    def __init__(self, history_drained: Callable[[], bool]) -> None:
        self._drained = history_drained
        self._root: asyncio.Future[Any] | None = None
        self._parked: list[tuple[asyncio.Future[None], Callable[[], NonDeterminismError]]] = []
        self._armed = False
        # futures outside the engine a branch waits on: the check runs again when one ends
        self._watched: set[asyncio.Future[Any]] = set()

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
            return
        state, outside = (
            (Branches.BLOCKED, []) if self._root is None else branches_state(self._root, {f for f, _ in self._parked})
        )
        if state is Branches.BLOCKED:
            parked, self._parked = self._parked, []
            for answer, diverged in parked:
                if not answer.done():
                    answer.set_exception(diverged())
        elif state is Branches.RUNNABLE:
            self._arm()  # some branch can still run: look again after it did
        else:  # undecided until what a branch waits on outside the engine completes
            for future in outside:
                if future not in self._watched:
                    self._watched.add(future)
                    future.add_done_callback(self._outside_done)

    def _outside_done(self, future: asyncio.Future[Any]) -> None:
        self._watched.discard(future)
        if self._parked:
            self._arm()

    def _release(self) -> None:
        parked, self._parked = self._parked, []
        for answer, _ in parked:
            if not answer.done():
                answer.set_result(None)


class Branches(enum.Enum):
    """What the branches of a run can do next (``branches_state``)."""

    RUNNABLE = "runnable"  # one can run now
    WAITING = "waiting"  # none can run now, but one waits on a future outside the engine
    BLOCKED = "blocked"  # every one is parked at a new step or finished: nothing will change


def branches_state(
    root: asyncio.Future[Any], parked: set[asyncio.Future[None]]
) -> tuple[Branches, list[asyncio.Future[Any]]]:
    """What the branches under ``root`` can do next, with the futures outside the engine
    they wait on (``WAITING``)."""
    stack: list[asyncio.Future[Any]] = [root]
    seen: set[int] = set()
    outside: list[asyncio.Future[Any]] = []
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
                return Branches.RUNNABLE, []
            stack.append(waiter)
            continue
        children = getattr(future, "_children", None)  # asyncio.gather's future
        if children is not None:
            if all(child.done() for child in children):
                return Branches.RUNNABLE, []  # it completes once their callbacks ran
            stack.extend(children)
        else:  # outside the engine: a sleep, I/O, an asyncio.Event, wait_for's waiter...
            outside.append(future)
    return (Branches.WAITING, outside) if outside else (Branches.BLOCKED, [])
