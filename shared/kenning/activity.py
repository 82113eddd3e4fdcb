"""``@activity``: a step whose result is recorded once and replayed ever after."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import math
import threading
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Protocol, cast, overload

from typing_extensions import ParamSpec, TypeVar

from kenning.errors import ActivityTimeoutError, ConfigurationError
from kenning.retry import RetryPolicy

if TYPE_CHECKING:
    from kenning.context import WorkflowContext

# The result first and the parameters defaulted (PEP 696), so ``Activity[Receipt]`` still
# names an activity returning a Receipt, whatever it takes, as before parameters were typed.
R = TypeVar("R", default=Any)
P = ParamSpec("P", default=...)
R2 = TypeVar("R2")
P2 = ParamSpec("P2")


class Activity(Generic[R, P]):
    """A decorated activity; call it as ``await act(ctx, *args, **kwargs)``, checked by the
    type checker against the function's parameters (``P``, after the context).

    ``activity_id=`` (Edda's, for concurrent calls) is accepted in the same call, but PEP 612
    allows no keyword beside a function's own, so such a call is not checked; the checked
    form is ``await act.options(activity_id="a")(ctx, *args, **kwargs)``.
    Sync functions are accepted and run in a thread (Edda 0.1.0 required ``async def``).
    ``timeout`` bounds each attempt (None: the worker's ``--activity-timeout``, if any).
    """

    def __init__(
        self,
        func: Callable[..., Awaitable[R]] | Callable[..., R],  # its parameters are bound to P by @activity
        retry_policy: RetryPolicy | None,
        timeout: float | None = None,
        heartbeat_timeout: float | None = None,
    ) -> None:
        self.func = func
        self.name: str = func.__name__
        self.retry_policy = retry_policy
        self.timeout = timeout
        # an attempt this long without ctx.heartbeat fails (HeartbeatTimeoutError)
        self.heartbeat_timeout = heartbeat_timeout
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

    @overload
    async def __call__(self, ctx: WorkflowContext, /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    async def __call__(self, ctx: WorkflowContext, /, *args: Any, activity_id: str | None, **kwargs: Any) -> R: ...
    async def __call__(self, ctx: WorkflowContext, /, *args: Any, **kwargs: Any) -> R:
        activity_id = kwargs.pop("activity_id", None)
        result: R = await ctx.runtime.run_activity(self, args, kwargs, activity_id)
        return result

    def options(self, *, activity_id: str) -> Callable[Concatenate[WorkflowContext, P], Awaitable[R]]:
        """This activity called with ``activity_id``, its arguments checked as a plain call's:
        ``await act.options(activity_id=f"square-{n}")(ctx, n)``."""

        async def call(ctx: WorkflowContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
            result: R = await ctx.runtime.run_activity(self, args, kwargs, activity_id)
            return result

        return call

    def __repr__(self) -> str:
        return f"<activity {self.__module__}.{self.__qualname__}>"


class ActivityDecorator(Protocol):
    # an async function also fits the last overload, as Activity[Coroutine]: the first match wins
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, func: Callable[Concatenate[WorkflowContext, P2], Awaitable[R2]], /
    ) -> Activity[R2, P2]: ...
    @overload
    def __call__(self, func: Callable[Concatenate[WorkflowContext, P2], R2], /) -> Activity[R2, P2]: ...
    @overload
    def __call__(self, func: Callable[..., Awaitable[R2]], /) -> Activity[R2]: ...
    @overload
    def __call__(self, func: Callable[..., R2], /) -> Activity[R2]: ...


# an async function also fits the sync overloads, as Activity[Coroutine]: the first match wins
@overload
def activity(  # type: ignore[overload-overlap]
    func: Callable[Concatenate[WorkflowContext, P2], Awaitable[R2]], /
) -> Activity[R2, P2]: ...
@overload
def activity(func: Callable[Concatenate[WorkflowContext, P2], R2], /) -> Activity[R2, P2]: ...
# a signature a checker cannot split into the context and P (mypy: ``(ctx, **kwargs)``, whose
# ctx could be given by name): an activity of unchecked parameters, as before they were typed
@overload
def activity(func: Callable[..., Awaitable[R2]], /) -> Activity[R2]: ...
@overload
def activity(func: Callable[..., R2], /) -> Activity[R2]: ...
@overload
def activity(
    *,
    retry_policy: RetryPolicy | None = None,
    timeout: float | timedelta | None = None,
    heartbeat_timeout: float | timedelta | None = None,
) -> ActivityDecorator: ...


def activity(
    func: Callable[..., Any] | None = None,
    /,
    *,
    retry_policy: RetryPolicy | None = None,
    timeout: float | timedelta | None = None,
    heartbeat_timeout: float | timedelta | None = None,
) -> Activity[Any] | ActivityDecorator:
    """Mark a function as an activity: ``@activity`` or ``@activity(retry_policy=..., timeout=...)``.

    ``timeout`` (seconds, or a ``timedelta``) bounds each attempt, like Temporal's
    start-to-close timeout: an attempt still running then fails with
    ``ActivityTimeoutError`` and the retry policy applies. An async activity is cancelled;
    a sync one cannot be stopped, so its thread is abandoned and keeps running in the
    background until the function returns (its result is then dropped).

    ``heartbeat_timeout`` (seconds, or a ``timedelta``): an attempt that goes that long
    without calling ``ctx.heartbeat`` fails with ``HeartbeatTimeoutError`` (an
    ``ActivityTimeoutError``), stopped as a timed-out one is; the next attempt reads the
    last details in ``ctx.heartbeat_details``.
    """

    def wrap(f: Callable[..., Any]) -> Activity[Any]:
        if isinstance(f, Activity):
            raise TypeError(f"{f.name} is already an activity")
        return Activity(
            f,
            retry_policy,
            timeout_seconds(timeout, f"@activity {f.__qualname__}"),
            timeout_seconds(heartbeat_timeout, f"@activity {f.__qualname__} heartbeat"),
        )

    # wrap is each overload of ActivityDecorator at once, which mypy cannot infer from its body
    return wrap(func) if func is not None else cast(ActivityDecorator, wrap)


def timeout_seconds(value: float | timedelta | None, owner: str) -> float | None:
    """A timeout in seconds, checked where it is declared (a positive, finite number)."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{owner}: timeout must be a positive number of seconds, got {value!r}")
    return float(seconds)


async def call_attempt(act: Activity[Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None) -> Any:
    """Run one attempt of ``act``; past ``timeout`` seconds raise ``ActivityTimeoutError``."""
    if timeout is None and (act.is_async or act.heartbeat_timeout is None):
        if act.is_async:
            return await act.func(*args, **kwargs)
        return await asyncio.to_thread(act.func, *args, **kwargs)
    if not act.is_async:
        return await _in_abandonable_thread(act, args, kwargs, timeout)
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await act.func(*args, **kwargs)
    except TimeoutError:
        if scope.expired():  # else the activity's own TimeoutError (an HTTP client's): its failure as is
            raise ActivityTimeoutError(f"activity {act.name} timed out after {timeout:g} s") from None
        raise


async def _in_abandonable_thread(
    act: Activity[Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
) -> Any:
    """A sync attempt in a daemon thread of its own: a thread cannot be stopped, and one
    left in the default executor would hold up the loop's and the process's exit. (With
    ``timeout`` None, the heartbeat timeout around it is what may abandon it.)"""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()  # ctx.session finds the attempt's transaction, as with to_thread

    def settle(result: Any, error: BaseException | None) -> None:
        if answer.done():  # timed out: nobody waits for it any more
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)

    def run() -> None:
        try:
            result, error = context.run(act.func, *args, **kwargs), None
        except BaseException as raised:  # handed to the awaiting task, as to_thread does
            result, error = None, raised
        with contextlib.suppress(RuntimeError):  # the loop closed while it ran
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"kenning-activity-{act.name}", daemon=True).start()
    try:
        async with asyncio.timeout(timeout):
            return await answer
    except TimeoutError:
        if answer.cancelled() and timeout is not None:
            raise ActivityTimeoutError(
                f"activity {act.name} timed out after {timeout:g} s (its thread keeps running in the background)"
            ) from None
        raise
