"""``env.override(charge, fake_charge)``: an activity (or a compensation) replaced for one
test, its step name and history unchanged, restored when the environment closes.

Only the body is replaced: the step keeps what the workflow declared, so a saga behaves
in a test as in production. The fake runs behind a wrapper that carries the real
function's signature, type hints and ``@on_failure`` compensation (``functools.wraps``):
the compensation is still registered when the fake succeeds, bound by the real
parameters' names; the fake's result is made into the declared return type (a dict into
the model the activity returns), the same value a replay rebuilds from history; the
activity's retry policy and timeouts still apply. A replacement that is itself an
``@activity`` brings the retry policy and timeouts it declares.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from kenning import serialization
from kenning.activity import Activity
from kenning.registry import Registry, qualified_name

# what a replacement ``@activity`` may declare for the step, beside its body
_SETTINGS = ("retry_policy", "timeout", "heartbeat_timeout")


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
            self._replace_activity(target, replacement)
            return
        name = qualified_name(target)
        if self.registry.compensation(name) is None:
            raise TypeError(f"override: {name} is neither an @activity nor a registered @compensation")
        original = self.registry.compensations[name]
        body = replacement.func if isinstance(replacement, Activity) else replacement
        # bound by the real compensation's parameters and hints, as production binds it
        self.registry.compensations[name] = functools.wraps(original)(_passing(body))

        def undo_compensation() -> None:
            self.registry.compensations[name] = original

        self._undo.append(undo_compensation)

    def _replace_activity(self, target: Activity[Any], replacement: Callable[..., Any]) -> None:
        before = {"func": target.func, "is_async": target.is_async, **{k: getattr(target, k) for k in _SETTINGS}}
        body = replacement.func if isinstance(replacement, Activity) else replacement
        annotation = serialization.type_hints(target.func).get("return", inspect.Parameter.empty)
        label = f"override of activity {target.name}"
        target.func = functools.wraps(target.func)(_converting(body, annotation, label))
        target.is_async = inspect.iscoroutinefunction(body)
        if isinstance(replacement, Activity):  # what the fake declares, explicitly, wins
            for setting in _SETTINGS:
                if getattr(replacement, setting) is not None:
                    setattr(target, setting, getattr(replacement, setting))

        def undo_activity() -> None:
            for key, value in before.items():
                setattr(target, key, value)

        self._undo.append(undo_activity)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def _passing(body: Callable[..., Any]) -> Callable[..., Any]:
    """``body`` behind a function of its own, to be given another's metadata."""
    if inspect.iscoroutinefunction(body):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            return await body(*args, **kwargs)

        return run_async

    def run(*args: Any, **kwargs: Any) -> Any:
        return body(*args, **kwargs)

    return run


def _converting(body: Callable[..., Any], annotation: Any, label: str) -> Callable[..., Any]:
    """``body`` whose result is rebuilt as ``annotation`` (through JSON, as a replay
    rebuilds it), async if ``body`` is."""

    def convert(result: Any) -> Any:
        if annotation is inspect.Parameter.empty or isinstance(result, bytes | bytearray | memoryview):
            return result
        try:
            return serialization.from_json(serialization.to_json(result), annotation)
        except ValueError as error:  # pydantic's ValidationError
            raise TypeError(f"{label}: the fake's result {result!r} is not a {annotation!r}: {error}") from None

    if inspect.iscoroutinefunction(body):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            return convert(await body(*args, **kwargs))

        return run_async

    def run(*args: Any, **kwargs: Any) -> Any:
        return convert(body(*args, **kwargs))

    return run
