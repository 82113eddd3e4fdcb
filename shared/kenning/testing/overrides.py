"""``env.override(charge, fake_charge)``: an activity (or a compensation) replaced for one
test, its step name and history unchanged, restored when the environment closes."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from kenning.activity import Activity
from kenning.registry import Registry, qualified_name


class Overrides:
    """The replacements in force, each undone by ``restore`` (newest first)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._undo: list[Callable[[], None]] = []

    def replace(self, target: Activity[Any] | Callable[..., Any], replacement: Callable[..., Any]) -> None:
        """``target``: an ``@activity`` (its function is swapped, wherever a workflow calls
        it) or a registered ``@compensation`` (its registry entry is swapped: sagas find
        compensations by name). ``replacement`` takes the same arguments, ``ctx`` first."""
        if not callable(replacement):
            raise TypeError(f"override of {target!r}: the replacement must be callable, got {replacement!r}")
        if isinstance(target, Activity):
            func, is_async = target.func, target.is_async
            target.func, target.is_async = replacement, inspect.iscoroutinefunction(replacement)

            def undo_activity() -> None:
                target.func, target.is_async = func, is_async

            self._undo.append(undo_activity)
            return
        name = qualified_name(target)
        if self.registry.compensation(name) is None:
            raise TypeError(f"override: {name} is neither an @activity nor a registered @compensation")
        original = self.registry.compensations[name]
        self.registry.compensations[name] = replacement

        def undo_compensation() -> None:
            self.registry.compensations[name] = original

        self._undo.append(undo_compensation)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()
