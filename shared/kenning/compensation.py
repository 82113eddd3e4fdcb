"""Saga compensation as users declare it: ``@compensation``, ``@on_failure`` and
``register_compensation``. The engine runs them with ``kenning.engine.saga``.

Fixes Edda 0.1.0: compensations are retried with the activity's policy and looked up by
``module:qualname``. An ``@on_failure`` compensation is called as Edda calls it, by name:
the activity's arguments by parameter name merged with its dict result (the result wins),
given to the parameters the compensation declares (all of them if it takes ``**kwargs``).
Positional arguments are named rather than dropped (Edda passed only keyword arguments).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from kenning import serialization

# ON_FAILURE_PREFIX: the comp_id prefix of compensations ``@on_failure`` registers (the
# engine sets it): their stored kwargs are the activity's named arguments and result,
# bound by name. Defined in core: a fork's statement reads it too (kenning/storage/forks.py).
from kenning.core.names import ON_FAILURE_PREFIX as ON_FAILURE_PREFIX
from kenning.errors import ConfigurationError, KenningError
from kenning.registry import REGISTRY, qualified_name

if TYPE_CHECKING:
    from kenning.context import WorkflowContext

F = TypeVar("F", bound=Callable[..., Any])

log = structlog.get_logger("kenning.compensation")


class CompensationFailedError(KenningError):
    """A compensation failed for good: the saga is not undone. ``kenning instances retry``
    runs the compensations that have not succeeded yet (after a deploy that fixes them)."""


def compensation(func: F) -> F:
    """Register ``func`` so any worker can run it, even one that did not run the workflow."""
    REGISTRY.add_compensation(func)
    return func


def on_failure(compensation_func: Callable[..., Any]) -> Callable[[F], F]:
    """Attach a compensation to an activity; it is registered each time the activity
    succeeds, and called with the activity's arguments and result keys by name.

    Checked here, at import: each required parameter of the compensation must be a
    parameter of the activity or possibly a key of its result, else ``ConfigurationError``
    names it.
    """
    REGISTRY.add_compensation(compensation_func)

    def decorator(func: F) -> F:
        check_on_failure(getattr(func, "func", func), compensation_func)
        func._kenning_on_failure = compensation_func  # type: ignore[attr-defined]
        return func

    return decorator


def check_on_failure(activity_func: Callable[..., Any], compensation_func: Callable[..., Any]) -> None:
    """Raise ``ConfigurationError`` naming the parameter when ``compensation_func`` can
    never be called from what ``activity_func`` receives and returns."""
    act_name = getattr(activity_func, "__name__", repr(activity_func))
    comp_name = qualified_name(compensation_func)
    where = f"@on_failure({comp_name}) on {act_name}"
    params = list(serialization.signature(_function(compensation_func)).parameters.values())
    if not params or params[0].kind in (params[0].KEYWORD_ONLY, params[0].VAR_KEYWORD):
        raise ConfigurationError(f"{where}: the compensation must take the context as its first parameter")
    act_params = list(serialization.signature(activity_func).parameters.values())[1:]
    act_names = {p.name for p in act_params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in act_params)
    result_keys, result_shape = _result_keys(activity_func)
    for param in params[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.default is not param.empty:
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"{where}: compensation parameter {param.name!r} is positional-only and cannot be bound by name"
            )
        if param.name in act_names or open_kwargs or result_keys is None or param.name in result_keys:
            continue
        raise ConfigurationError(
            f"{where}: compensation parameter {param.name!r} is neither a parameter of {act_name} nor a key "
            f"of its result ({result_shape}); give it a default, or register the compensation explicitly "
            "with register_compensation"
        )


def _function(func: Callable[..., Any]) -> Callable[..., Any]:
    """The plain function (an ``@activity`` used as a compensation runs its function)."""
    inner: Callable[..., Any] = getattr(func, "func", func)
    return inner


def _result_keys(activity_func: Callable[..., Any]) -> tuple[frozenset[str] | None, str]:
    """The keys the activity's result may have, from its return annotation: None when any
    key may come (a ``dict``, ``Any``, no annotation), else the TypedDict's keys or none."""
    hints = serialization.type_hints(activity_func)
    if "return" not in hints:
        return None, "unannotated"
    annotation = hints["return"]
    if typing.is_typeddict(annotation):
        keys = frozenset(typing.get_type_hints(annotation))
        return keys, f"keys: {', '.join(sorted(keys)) or 'none'}"
    options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    for option in options:
        if typing.is_typeddict(option):
            continue
        origin = typing.get_origin(option) or option
        if option is Any or (isinstance(origin, type) and issubclass(origin, Mapping)):
            return None, "a dict"
    typed = frozenset(k for o in options if typing.is_typeddict(o) for k in typing.get_type_hints(o))
    return typed, f"it returns {_describe(annotation)}"


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _describe(annotation: Any) -> str:
    if annotation is None or annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", None) or repr(annotation)


def on_failure_arguments(
    activity_func: Callable[..., Any],
    compensation_func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    result: Any,
) -> dict[str, Any]:
    """What an ``@on_failure`` compensation is registered with: every argument the activity
    received, by parameter name (its defaults and ``**kwargs`` included, ``*args`` left
    out), merged with its dict result, whose keys win as in Edda.

    All of it is stored; the compensation takes the names it declares when it runs (see
    ``bind_on_failure``), so a deploy that changes its signature can still be served on
    ``kenning instances retry``.
    """
    named: dict[str, Any] = {}
    function = _function(activity_func)
    try:
        bound = serialization.signature(function).bind(None, *args, **kwargs)  # None: the ctx slot
    except TypeError:  # the activity ran with these arguments; keep what is named at least
        named.update(kwargs)
    else:
        bound.apply_defaults()
        for param in list(bound.signature.parameters.values())[1:]:
            if param.kind is param.VAR_POSITIONAL:
                continue
            value = bound.arguments.get(param.name)
            if param.kind is param.VAR_KEYWORD:
                named.update(value or {})
            else:
                named[param.name] = value
    if isinstance(result, dict):
        named.update(result)
    missing = _missing(compensation_func, named)
    if missing:
        # Not raised: the activity's effect happened and the record is what a fixed
        # compensation will need; the rollback fails naming it, and is retried after a deploy.
        log.warning(
            "compensation.unbindable",
            compensation=qualified_name(compensation_func),
            activity=getattr(activity_func, "__name__", ""),
            missing=missing,
            available=sorted(named),
        )
    return named


def _missing(compensation_func: Callable[..., Any], stored: Mapping[str, Any]) -> list[str]:
    """Required parameters of the compensation (besides ctx) that ``stored`` cannot fill."""
    params = list(serialization.signature(_function(compensation_func)).parameters.values())[1:]
    return [
        p.name
        for p in params
        if p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and (p.kind is p.POSITIONAL_ONLY or p.name not in stored)
    ]


def bind_on_failure(compensation_func: Callable[..., Any], stored: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of an ``@on_failure`` call: the stored names the compensation
    declares (all of them if it takes ``**kwargs``). ``TypeError`` names a required
    parameter nothing provides."""
    params = list(serialization.signature(_function(compensation_func)).parameters.values())[1:]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    by_name = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = _missing(compensation_func, stored)
    if missing:
        names = ", ".join(repr(m) for m in missing)
        raise TypeError(
            f"compensation {qualified_name(compensation_func)} cannot be called: missing parameter {names} "
            f"(neither an argument of the activity nor a key of its result; available: "
            f"{', '.join(sorted(stored)) or 'none'})"
        )
    return {k: v for k, v in stored.items() if takes_any or k in by_name}


async def register_compensation(
    ctx: WorkflowContext,
    compensation_func: Callable[..., Any],
    *args: Any,
    activity_id: str | None = None,
    **kwargs: Any,
) -> None:
    """Push a compensation; on failure or cancellation they run last-in, first-out, each
    called with exactly the arguments given here."""
    REGISTRY.add_compensation(compensation_func)
    try:  # a call that can never work fails the workflow here, not the rollback later
        serialization.signature(_function(compensation_func)).bind(ctx, *args, **kwargs)
    except TypeError as error:
        raise TypeError(f"register_compensation({qualified_name(compensation_func)}): {error}") from None
    ctx.runtime.register_compensation(compensation_func, args, kwargs, activity_id)
