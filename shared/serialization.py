"""JSON in and out of the database, restored by type hints.

Pydantic models, enums, dataclasses, datetimes and ``list[Model]`` become JSON on the way
in and are rebuilt from the parameter or return annotation on the way out, so a replayed
activity returns the same type as a live one.
"""

from __future__ import annotations

import importlib
import inspect
import traceback
import typing
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import pydantic
import pydantic_core

from kenning.errors import ReplayedActivityError


def to_json(value: Any) -> Any:
    """A JSON-compatible copy of ``value``; raises ``TypeError`` naming what cannot be stored."""
    try:
        return pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        raise TypeError(f"value of type {type(value).__name__} cannot be stored as JSON: {exc}") from None


@lru_cache(maxsize=4096)
def _adapter(annotation: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(annotation)


def from_json(value: Any, annotation: Any) -> Any:
    """Rebuild ``value`` as ``annotation``; unannotated (``Any``) values stay plain JSON."""
    if annotation is inspect.Parameter.empty or annotation is Any or annotation is None:
        return value
    try:
        return _adapter(annotation).validate_python(value)
    except TypeError:  # an annotation pydantic cannot build an adapter for
        return value


@lru_cache(maxsize=4096)
def type_hints(func: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func)
    except Exception:  # unresolved forward references: fall back to plain JSON
        return {}


@lru_cache(maxsize=4096)
def signature(func: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature``, computed once per function (it is on every start and replay)."""
    return inspect.signature(func)


def bind_arguments(func: Callable[..., Any], data: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``func(ctx, **kwargs)`` from stored JSON ``data``.

    Edda's rule is kept: a function with exactly one parameter (besides ``ctx``) typed as a
    pydantic model, whose name is not a key of ``data``, receives the whole of ``data`` as
    that model — the shape of a CloudEvent's data.
    """
    hints = type_hints(func)
    params = [
        p for p in list(signature(func).parameters.values())[1:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if len(params) == 1:
        only = params[0]
        hint = hints.get(only.name)
        if isinstance(hint, type) and issubclass(hint, pydantic.BaseModel) and only.name not in data:
            return {only.name: hint.model_validate(data)}
    bound: dict[str, Any] = {}
    for key, value in data.items():
        bound[key] = from_json(value, hints.get(key, Any))
    return bound


def encode_error(error: BaseException) -> dict[str, Any]:
    """A JSON description of an exception from which ``decode_error`` rebuilds its class."""
    cls = type(error)
    args: list[Any] | None
    try:
        args = to_json(list(error.args))
    except TypeError:
        args = None
    encoded: dict[str, Any] = {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(error),
        "args": args,
        "traceback": "".join(traceback.format_exception(error))[-8000:],
    }
    if error.__cause__ is not None:
        encoded["cause"] = encode_error(error.__cause__)
    return encoded


def _load_class(dotted: str) -> type[BaseException] | None:
    module_name, _, qualname = dotted.rpartition(".")
    while module_name:
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            module_name, _, head = module_name.rpartition(".")
            qualname = f"{head}.{qualname}"
            continue
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            return obj
        return None
    return None


def decode_error(encoded: dict[str, Any]) -> BaseException:
    """The exception ``encode_error`` described, with its class and cause.

    Fixes Edda 0.1.0, which re-raised every replayed failure as a plain ``Exception``.
    """
    dotted = str(encoded.get("type", "Exception"))
    message = str(encoded.get("message", ""))
    cls = _load_class(dotted)
    error: BaseException | None = None
    if cls is not None:
        args = encoded.get("args")
        for attempt in ((*args,) if isinstance(args, list) else None, (message,)):
            if attempt is None:
                continue
            try:
                error = cls(*attempt)
                break
            except Exception:
                continue
    if error is None:
        error = ReplayedActivityError(dotted, message)
    cause = encoded.get("cause")
    if isinstance(cause, dict):
        error.__cause__ = decode_error(cause)
    return error


__all__ = [
    "bind_arguments",
    "decode_error",
    "encode_error",
    "from_json",
    "to_json",
    "type_hints",
]
