"""What ``kenning up`` suggests to try: a command per workflow of the app it runs, with a
JSON input of the shape the workflow takes."""

from __future__ import annotations

import enum
import json
import shlex
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pydantic

from kenning import serialization
from kenning.app import App
from kenning.workflow import Workflow

MAX_HINTS = 4


def _sample(annotation: Any, seen: frozenset[type] = frozenset()) -> Any:
    """A JSON value of this type: a model's first declared example, else placeholders.

    ``seen`` holds the models being sampled on the way here: a model that contains itself
    (``children: list["Node"]``) gets an empty list or ``None`` there, never a recursion."""
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _sample(arguments[0], seen)
    if origin in (typing.Union, types.UnionType):
        present = next((a for a in arguments if a is not type(None)), None)
        if present in seen and type(None) in arguments:
            return None
        return _sample(present, seen)
    if origin is typing.Literal:
        return arguments[0]
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return {}
    if isinstance(origin, type) and issubclass(origin, (Sequence, set, frozenset)) and not issubclass(origin, str):
        items = [a for a in arguments if a is not Ellipsis]
        if origin is tuple and Ellipsis not in arguments:
            return [_sample(a, seen) for a in items]
        return [_sample(items[0], seen)] if items and items[0] not in seen else []
    if isinstance(annotation, type):
        if issubclass(annotation, pydantic.BaseModel):
            return _model_sample(annotation, seen)
        if issubclass(annotation, enum.Enum):
            return next(iter(annotation)).value
        if issubclass(annotation, bool):
            return False
        if issubclass(annotation, int):
            return 0
        if issubclass(annotation, float):
            return 0.0
        if issubclass(annotation, Mapping):
            return {}
        if issubclass(annotation, (list, tuple, set, frozenset)):
            return []
    return "..."


def _model_sample(model: type[pydantic.BaseModel], seen: frozenset[type] = frozenset()) -> dict[str, Any]:
    extra = model.model_config.get("json_schema_extra")  # as written: the schema sorts keys
    examples = extra.get("examples") if isinstance(extra, dict) else None
    if isinstance(examples, list) and examples and isinstance(examples[0], dict):
        return examples[0]
    if model in seen:  # a required field of its own type: no finite value has it
        return {}
    inner = seen | {model}
    return {
        field.alias or name: _sample(field.annotation, inner)
        for name, field in model.model_fields.items()
        if field.is_required()
    }


def sample_input(func: Callable[..., Any]) -> dict[str, Any]:
    """Keyword arguments for ``func(ctx, ...)`` as JSON, the required ones only; a single
    pydantic parameter takes the model's fields (``serialization.bind_arguments``' rule)."""
    hints = serialization.type_hints(func)
    params = [
        p
        for p in list(serialization.signature(func).parameters.values())[1:]
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if len(params) == 1:
        hint = hints.get(params[0].name)
        if isinstance(hint, type) and issubclass(hint, pydantic.BaseModel):
            return _model_sample(hint)
    return {p.name: _sample(hints.get(p.name, Any)) for p in params if p.default is p.empty}


def _command(verb: str, name: str, flag: str, func: Callable[..., Any] | None) -> str:
    try:
        data = sample_input(func) if func is not None else {}
        shown = json.dumps(data)
    except Exception:  # a type we cannot sample, whatever the reason: a hint must never stop `up`
        data, shown = {"...": "..."}, "{...}"
    text = f"kenning {verb} {shlex.quote(name)}"
    return f"{text} {flag} {shlex.quote(shown)}" if data or verb == "send" else text


def hints(app: App) -> list[str]:
    """Commands that start the app's workflows: ``send`` for event handlers (first), ``start``
    for the others; workflows on a cron schedule start by themselves and are left out."""
    workflows: list[Workflow[Any]] = sorted(app.registry.workflows.values(), key=lambda wf: wf.name)
    commands = [_command("send", wf.name, "--data", wf.func) for wf in workflows if wf.event_handler]
    commands += [_command("send", event_type, "--data", None) for event_type in sorted(app.event_handlers)]
    commands += [
        _command("start", wf.name, "--input", wf.func)
        for wf in workflows
        if not wf.event_handler and wf.schedule is None
    ]
    if len(commands) > MAX_HINTS:
        more = len(commands) - MAX_HINTS + 1
        return [*commands[: MAX_HINTS - 1], f"... and {more} more workflows"]
    return commands
