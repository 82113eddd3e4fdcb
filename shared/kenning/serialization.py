"""JSON in and out of the database, restored by type hints.

Pydantic models, enums, dataclasses, datetimes and ``list[Model]`` become JSON on the way
in and are rebuilt from the parameter or return annotation on the way out, so a replayed
activity returns the same type as a live one.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import traceback
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pydantic
import pydantic_core

from kenning import codecs
from kenning.errors import ReplayedActivityError, UnstorableValueError

# PostgreSQL's jsonb holds at most 255 MiB (and a field 1 GiB).
_JSONB_MAX_CHARS = 255 * 1024 * 1024


def to_json(value: Any) -> Any:
    """A JSON-compatible copy of ``value``; raises ``TypeError`` naming what cannot be stored."""
    try:
        return pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        raise TypeError(f"value of type {type(value).__name__} cannot be stored as JSON: {exc}") from None


def storable_json(value: Any, what: str) -> Any:
    """``to_json(value)``, checked before any write and sealed (``kenning.codecs.seal``:
    encrypted when keys are set): a value PostgreSQL would refuse raises
    ``UnstorableValueError`` (a ``TerminalError``) saying ``what`` and why.

    A write refused by the database fails again on every replay; deciding here makes the
    value the step's error instead, once. The check is on the plain value: an envelope is
    always storable.
    """
    try:
        jsonable = to_json(value)
    except TypeError as error:
        raise UnstorableValueError(f"{what} cannot be stored: {error}") from None
    reason = unstorable_reason(jsonable)
    if reason is not None:
        raise UnstorableValueError(f"{what} cannot be stored: {reason}")
    return codecs.seal(jsonable)


@dataclass(frozen=True)
class Unstorable:
    """Why jsonb would refuse a value: ``kind`` for callers that word it their own way (the
    ingress's 400 answers), ``reason`` in Kenning's words, naming the place."""

    kind: typing.Literal["number", "encoding", "depth", "nul", "surrogate", "size"]
    reason: str


def unstorable(jsonable: Any) -> Unstorable | None:
    """What PostgreSQL's jsonb would refuse in this JSON-compatible value, or None: the one
    definition, for the engine's writes, ``Client.start`` and the ingress.

    One ``json.dumps`` (the encoding the storage layer sends) and substring tests on it; the
    value is walked only to name the place of a suspect, which also rules out false alarms
    (a literal backslash-u0000 in a string, an emoji written as a surrogate pair).
    """
    try:
        text = json.dumps(jsonable, allow_nan=False)
    except ValueError as error:
        at = _find(jsonable, lambda v: isinstance(v, float) and not math.isfinite(v))
        if at is not None:
            return Unstorable("number", f"contains NaN or an infinity at {at[0]} (JSON has no such number)")
        return Unstorable("encoding", f"cannot be encoded as JSON: {error}")
    except TypeError as error:
        return Unstorable("encoding", f"cannot be encoded as JSON: {error}")
    except RecursionError:
        return Unstorable("depth", "is nested too deeply to be encoded as JSON")
    if "\\u0000" in text:
        found = _find(jsonable, lambda v: isinstance(v, str) and "\x00" in v)
        if found is not None:
            where = f"in a key at {found[0]}" if found[1] else f"at {found[0]}"
            return Unstorable("nul", f"contains a NUL character {where} (PostgreSQL text and jsonb refuse it)")
    if "\\ud" in text:
        found = _find(jsonable, lambda v: isinstance(v, str) and not _is_utf8(v))
        if found is not None:
            where = f"in a key at {found[0]}" if found[1] else f"at {found[0]}"
            return Unstorable("surrogate", f"contains a surrogate code point {where} (not valid Unicode text)")
    if len(text) > _JSONB_MAX_CHARS:
        return Unstorable("size", f"is {len(text)} characters of JSON, more than PostgreSQL's jsonb holds (255 MiB)")
    return None


def unstorable_reason(jsonable: Any) -> str | None:
    """Why PostgreSQL's jsonb would refuse this JSON-compatible value, or None."""
    found = unstorable(jsonable)
    return None if found is None else found.reason


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL and lone surrogates written as escapes.

    For error messages and tracebacks: the failure itself must always be storable.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii() and not _is_utf8(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _find(value: Any, bad: Callable[[Any], bool], path: str = "$") -> tuple[str, bool] | None:
    """The JSON path of the first value (or key: the flag) ``bad`` accepts."""
    if isinstance(value, dict):
        for key, item in value.items():
            if bad(key):
                return path, True
            found = _find(item, bad, f"{path}.{key}" if str(key).isidentifier() else f"{path}[{str(key)!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):  # json.dumps writes a tuple as a list
        for index, item in enumerate(value):
            found = _find(item, bad, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return (path, False) if bad(value) else None


@lru_cache(maxsize=4096)
def _adapter(annotation: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(annotation)


def from_json(value: Any, annotation: Any) -> Any:
    """Rebuild ``value`` (opened if sealed) as ``annotation``; unannotated (``Any``) values
    stay plain JSON."""
    value = codecs.unseal(value)
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
    data = codecs.unseal(data)
    hints = type_hints(func)
    params = [
        p for p in list(signature(func).parameters.values())[1:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if len(params) == 1:
        only = params[0]
        hint = hints.get(only.name)
        if isinstance(hint, type) and issubclass(hint, pydantic.BaseModel) and only.name not in data:
            try:
                return {only.name: hint.model_validate(data)}
            except pydantic.ValidationError as error:
                raise InputValidationError(one_line(error)) from None
    bound: dict[str, Any] = {}
    for key, value in data.items():
        try:
            bound[key] = from_json(value, hints.get(key, Any))
        except pydantic.ValidationError as error:
            raise InputValidationError(one_line(error, key)) from None
    return bound


class InputValidationError(ValueError):
    """Arguments that do not validate as their parameters' types, in one line naming each
    bad field (pydantic's own message spreads them over lines a CLI's error shows the first of)."""


def one_line(error: pydantic.ValidationError, parameter: str | None = None) -> str:
    """``error``'s problems as ``path: message; ...``, each path led by ``parameter``."""
    problems = []
    for problem in error.errors(include_url=False):
        path = ".".join(str(part) for part in ((parameter,) if parameter else ()) + tuple(problem["loc"]))
        problems.append(f"{path or parameter or 'input'}: {problem['msg']}")
    return "; ".join(problems)


def encode_error(error: BaseException) -> dict[str, Any]:
    """A JSON description of an exception from which ``decode_error`` rebuilds its class."""
    cls = type(error)
    args: list[Any] | None
    try:
        args = to_json(list(error.args))
    except TypeError:
        args = None
    if args is not None and unstorable_reason(args) is not None:
        args = None  # rebuilt from the (escaped) message instead
    encoded: dict[str, Any] = {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        # the message, arguments and traceback carry user data: sealed; the type stays plain
        "message": codecs.seal(storable_text(str(error))),
        "args": codecs.seal(args),
        "traceback": codecs.seal(storable_text("".join(traceback.format_exception(error))[-8000:])),
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
    encoded = codecs.unseal(encoded)
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
    "Unstorable",
    "bind_arguments",
    "decode_error",
    "encode_error",
    "from_json",
    "storable_json",
    "storable_text",
    "to_json",
    "type_hints",
    "unstorable",
    "unstorable_reason",
]
