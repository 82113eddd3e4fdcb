"""Saga compensation: ``@compensation``, ``@on_failure`` and ``register_compensation``.

Fixes Edda 0.1.0: positional and keyword arguments are both kept, compensations are
retried with the activity's policy, and they are looked up by ``module:qualname``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from kenning.registry import REGISTRY

if TYPE_CHECKING:
    from kenning.context import WorkflowContext

F = TypeVar("F", bound=Callable[..., Any])


def compensation(func: F) -> F:
    """Register ``func`` so any worker can run it, even one that did not run the workflow."""
    REGISTRY.add_compensation(func)
    return func


def on_failure(compensation_func: Callable[..., Any]) -> Callable[[F], F]:
    """Attach a compensation to an activity; it is registered each time the activity
    succeeds, with the activity's arguments (and the keys of a dict result, as in Edda)."""
    REGISTRY.add_compensation(compensation_func)

    def decorator(func: F) -> F:
        func._kenning_on_failure = compensation_func  # type: ignore[attr-defined]
        return func

    return decorator


async def register_compensation(
    ctx: WorkflowContext,
    compensation_func: Callable[..., Any],
    *args: Any,
    activity_id: str | None = None,
    **kwargs: Any,
) -> None:
    """Push a compensation; on failure or cancellation they run last-in, first-out."""
    REGISTRY.add_compensation(compensation_func)
    ctx._replayer.register_compensation(compensation_func, args, kwargs, activity_id)
