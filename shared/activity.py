"""``@activity``: a step whose result is recorded once and replayed ever after."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from kenning.retry import RetryPolicy

if TYPE_CHECKING:
    from kenning.context import WorkflowContext

R = TypeVar("R")


class Activity(Generic[R]):
    """A decorated activity; call it as ``await act(ctx, *args, activity_id=None, **kwargs)``.

    Sync functions are accepted and run in a thread (Edda 0.1.0 required ``async def``).
    """

    def __init__(self, func: Callable[..., Awaitable[R]] | Callable[..., R], retry_policy: RetryPolicy | None) -> None:
        self.func = func
        self.name: str = func.__name__
        self.retry_policy = retry_policy
        self.is_async = inspect.iscoroutinefunction(func)
        self.__name__ = func.__name__
        self.__qualname__ = func.__qualname__
        self.__module__ = func.__module__
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    @property
    def on_failure(self) -> Callable[..., Any] | None:
        """The compensation ``@on_failure`` attached, whichever order the decorators came in."""
        return getattr(self, "_kenning_on_failure", None) or getattr(self.func, "_kenning_on_failure", None)

    async def __call__(self, ctx: WorkflowContext, *args: Any, activity_id: str | None = None, **kwargs: Any) -> R:
        result: R = await ctx._replayer.run_activity(self, args, kwargs, activity_id)
        return result

    def __repr__(self) -> str:
        return f"<activity {self.__module__}.{self.__qualname__}>"


class ActivityDecorator(Protocol):
    @overload
    def __call__(self, func: Callable[..., Awaitable[R]], /) -> Activity[R]: ...
    @overload
    def __call__(self, func: Callable[..., R], /) -> Activity[R]: ...


@overload
def activity(func: Callable[..., Awaitable[R]], /) -> Activity[R]: ...
@overload
def activity(func: Callable[..., R], /) -> Activity[R]: ...
@overload
def activity(*, retry_policy: RetryPolicy | None = None) -> ActivityDecorator: ...


def activity(
    func: Callable[..., Any] | None = None, /, *, retry_policy: RetryPolicy | None = None
) -> Activity[Any] | ActivityDecorator:
    """Mark a function as an activity: ``@activity`` or ``@activity(retry_policy=...)``."""

    def wrap(f: Callable[..., Any]) -> Activity[Any]:
        if isinstance(f, Activity):
            raise TypeError(f"{f.name} is already an activity")
        return Activity(f, retry_policy)

    return wrap(func) if func is not None else wrap
