"""The services' pass loop (``kenning.hosting.passloop``), without a database: passes run again at once, after their
delay or on a wake-up; a failing pass is logged and retried; stop ends the loop."""

from __future__ import annotations

import asyncio
from typing import Any

from kenning.hosting.passloop import PassLoop


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    def error(self, event: str, **fields: Any) -> None:
        self.lines.append((event, {"level": "error", **fields}))


async def test_a_pass_runs_again_at_once_after_its_delay_or_on_a_wake_up() -> None:
    delays = [0.0, 0.0, 30.0, 0.02]  # twice at once, then a long sleep a wake-up cuts short, then a poll
    runs: list[float] = []
    polls: list[float] = []
    clock = asyncio.get_running_loop()

    async def one_pass() -> float:
        runs.append(clock.time())
        if len(runs) > len(delays):
            loop.stop()
            return 0.0
        return delays[len(runs) - 1]

    loop = PassLoop(
        one_pass, log=Log(), failed_event="x.pass_failed", retry_seconds=1.0, on_poll=lambda: polls.append(0)
    )
    task = asyncio.create_task(loop.run())
    while len(runs) < 3:
        await asyncio.sleep(0.001)
    loop.wake()  # cuts the 30 s sleep short
    await asyncio.wait_for(task, timeout=5)
    assert len(runs) == 5
    assert polls == [0]  # only the 0.02 s delay ran out


async def test_a_failing_pass_is_logged_and_retried_after_the_retry_delay() -> None:
    log = Log()
    calls = 0

    async def one_pass() -> float:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("connection refused")
        loop.stop()
        return 1.0

    loop = PassLoop(one_pass, log=log, failed_event="x.pass_failed", retry_seconds=0.01)
    await asyncio.wait_for(loop.run(), timeout=5)
    assert calls == 2
    assert log.lines == [("x.pass_failed", {"error": "OSError('connection refused')", "unavailable": True})]


async def test_a_pass_failing_for_another_reason_than_the_database_is_an_error() -> None:
    """A bug fails every pass the same way: the service is stopped until a person fixes it
    (docs/architecture.md invariant 9: an error line), with the traceback once per streak, not per pass."""
    log = Log()
    calls = 0

    async def one_pass() -> float:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise KeyError("missing" if calls < 3 else "other")
        loop.stop()
        return 1.0

    loop = PassLoop(one_pass, log=log, failed_event="x.pass_failed", retry_seconds=0.01)
    await asyncio.wait_for(loop.run(), timeout=5)
    failed = {"level": "error", "unavailable": False}
    assert log.lines == [
        ("x.pass_failed", {**failed, "error": "KeyError('missing')", "exc_info": True}),
        ("x.pass_failed", {**failed, "error": "KeyError('missing')", "exc_info": False}),
        ("x.pass_failed", {**failed, "error": "KeyError('other')", "exc_info": True}),
    ]


async def test_a_settle_delay_follows_a_wake_up_and_stop_skips_it() -> None:
    settled: list[int] = []
    passes = 0

    async def one_pass() -> float:
        nonlocal passes
        passes += 1
        return 30.0

    def settle() -> float:
        settled.append(passes)
        return 0.0

    loop = PassLoop(one_pass, log=Log(), failed_event="x.pass_failed", retry_seconds=1.0, settle=settle)
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(0.01)
    loop.wake()
    await asyncio.sleep(0.01)
    loop.stop()
    await asyncio.wait_for(task, timeout=5)
    assert passes == 2 and settled == [1]
