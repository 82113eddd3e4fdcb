"""The commit watch without a database: a probe whose commit does not return makes the
process not ready past the threshold, is logged once at error and again only after
``REPEAT_SECONDS``, shows in the gauge, and a completed commit is logged as the recovery.
The clock is the test's; the real fault, through real processes, is
``tests/system/test_commit_stall.py``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import REGISTRY

from kenning.db import Executor
from kenning.hosting import commitwatch
from kenning.hosting.commitwatch import CommitWatch


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def _at(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))

    def __getattr__(self, level: str) -> Any:
        return self._at(level)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gauge() -> float:
    return REGISTRY.get_sample_value("kenning_commit_stall_seconds") or 0.0


async def test_a_commit_that_does_not_return_is_reported_once_then_slowly_and_its_end_once() -> None:
    clock, log = Clock(), Log()
    commit_done = asyncio.Event()
    probes: list[int] = []

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[Executor]:
        yield None  # type: ignore[misc]  # the probe below never touches it

    async def probe(_conn: Executor) -> None:
        probes.append(1)
        if len(probes) == 2:  # the first commits at once, the second hangs until released
            await commit_done.wait()

    watch = CommitWatch(session, probe, stall_seconds=5.0, log=log, clock=clock)
    task = asyncio.create_task(watch._probing())
    try:
        while len(probes) < 2:  # the first probe completed; the second is in flight
            await asyncio.sleep(0.01)
        assert watch.verdict() is None and watch.waited() == 0.0
        clock.now += 4.9
        watch.look()
        assert watch.verdict() is None and log.lines == []
        assert abs(gauge() - 4.9) < 1e-6
        clock.now += 0.2
        for _ in range(3):  # ticks while it lasts: one line, not one per look
            watch.look()
        assert watch.verdict() == "commits not completing for 5.1 s"
        assert [(level, event) for level, event, _ in log.lines] == [("error", "database.commits_stalled")]
        assert log.lines[0][2]["cause"] == "commits not completing for 5.1 s"
        clock.now += commitwatch.REPEAT_SECONDS + 0.1
        watch.look()
        assert [event for _, event, _ in log.lines] == ["database.commits_stalled"] * 2
        commit_done.set()
        while len(log.lines) < 3:
            await asyncio.sleep(0.01)
        level, event, fields = log.lines[2]
        assert (level, event, fields["stalled_seconds"]) == ("info", "database.commits_resumed", 65.2)
        assert watch.verdict() is None and gauge() == 0.0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
