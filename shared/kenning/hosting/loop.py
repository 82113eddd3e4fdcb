"""The event loop each process runs on: uvloop where installed (it comes with
``uvicorn[standard]``), asyncio's own otherwise. Chosen per process in its entry point,
never as a global policy from library code (Edda 0.1.0 installed uvloop globally)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main)
