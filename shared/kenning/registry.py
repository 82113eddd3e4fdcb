"""The workflow registry: the one piece of process-wide state, filled by decorators at import.

It maps workflow names to workflows and compensation names to functions, so any worker
that imported the user's modules can resume any instance or finish its compensations.
It also knows the ``App``s this process made, weakly (an App dropped is gone from it), for
``wf.start()``: their ``db_url`` is its database when the environment names none.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kenning.errors import ConfigurationError

if TYPE_CHECKING:
    from kenning.app import App
    from kenning.queues import Queue
    from kenning.workflow import Workflow


def qualified_name(func: Callable[..., Any]) -> str:
    """``module:qualname``: unique where Edda's bare ``__name__`` collided across modules."""
    inner = getattr(func, "func", func)
    return f"{inner.__module__}:{inner.__qualname__}"


class Registry:
    def __init__(self) -> None:
        self.workflows: dict[str, Workflow[Any]] = {}
        self.compensations: dict[str, Callable[..., Any]] = {}
        self.queues: dict[str, Queue] = {}  # kenning.Queue declarations, synced by workers
        self.apps: weakref.WeakSet[App] = weakref.WeakSet()  # each App adds itself

    def add_workflow(self, wf: Workflow[Any]) -> None:
        existing = self.workflows.get(wf.name)
        if existing is not None and qualified_name(existing.func) != qualified_name(wf.func):
            raise ConfigurationError(
                f"two workflows are named {wf.name!r}: {qualified_name(existing.func)} and "
                f"{qualified_name(wf.func)}; pass name= to one of them"
            )
        self.workflows[wf.name] = wf

    def workflow(self, name: str) -> Workflow[Any]:
        try:
            return self.workflows[name]
        except KeyError:
            raise ConfigurationError(
                f"unknown workflow {name!r}; known: {', '.join(sorted(self.workflows)) or 'none'}"
            ) from None

    def add_queue(self, queue: Queue) -> None:
        existing = self.queues.get(queue.name)
        if existing is not None and existing != queue:
            raise ConfigurationError(f"queue {queue.name!r} is declared twice with different limits")
        self.queues[queue.name] = queue

    def add_compensation(self, func: Callable[..., Any]) -> str:
        name = qualified_name(func)
        self.compensations[name] = func
        return name

    def compensation(self, name: str) -> Callable[..., Any] | None:
        return self.compensations.get(name)


REGISTRY = Registry()
