"""The console's actions: cancel an instance, retry a failed one, start a workflow from a
form, send a CloudEvent. Each is a GET page that says what will happen and a POST (with
the form's CSRF token) that does it, so each asks for confirmation without a script;
each is logged (``console.action``) with the instance, the action and who asked.

They take the paths every other caller takes: cancel is ``kenning instances cancel``'s
statement (the instance's compensations then run on a worker), retry is
``kenning instances retry``'s (``retry_instance``), a start goes through
``kenning.starting`` (the input bound to the workflow's signature when the console loaded
its module with ``--app``), an event is written to the inbox as the ingress writes one.
"""

from __future__ import annotations

import inspect
import json
import uuid
from typing import Any
from urllib.parse import quote

import pydantic
import structlog
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.v1.event import CloudEvent
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning import serialization
from kenning.client.starts import start_on
from kenning.commands import steering
from kenning.core.limits import MAX_ID_LENGTH
from kenning.core.records import TERMINAL_STATUSES, InstanceRow
from kenning.events import reserved_attribute_error
from kenning.registry import REGISTRY
from kenning.starting import InvalidInputError, prepare_start
from kenning.storage import definitions as definitions_sql
from kenning.storage import instances as instances_sql
from kenning.storage.inbox import NewEvent, inbox_insert_events
from kenning.workflow import Workflow
from kenning_console.pages import render
from kenning_console.security import SESSION_COOKIE, require_csrf
from kenning_console.state import console_of

_log = structlog.get_logger("kenning.console")

SEND_SOURCE = "kenning-console"  # an event sent from the console, unless the form names another source
MAX_FIELD_LENGTH = 1_000_000  # characters in one form field (the JSON input or data)
TOO_DEEP = "{what} is nested too deeply to read as JSON"


def _who(request: Request) -> dict[str, Any]:
    """Who asked, for the action's log line: the admin token's holder (by bearer header or
    login session) when the console has a token, and the client's address either way."""
    client = request.client.host if request.client else None
    if not console_of(request).settings.admin_token:
        return {"client": client}
    via = "bearer" if request.headers.get("authorization", "").lower().startswith("bearer ") else "session"
    if via == "session" and SESSION_COOKIE not in request.cookies:
        via = "unknown"
    return {"client": client, "who": f"admin ({via})"}


def console_who(request: Request) -> steering.Who:
    """Who asked, as the operator action log records it: the admin and the client address."""
    who = _who(request)
    return steering.Who("console", " from ".join(str(v) for v in (who.get("who"), who["client"]) if v) or "unknown")


def instance_path(instance_id: str) -> str:
    """The instance's page (an id may hold any character; a slash stays a slash)."""
    return "/instances/" + quote(instance_id, safe="/")


def log_action(request: Request, action: str, **fields: Any) -> None:
    _log.info("console.action", action=action, **_who(request), **fields)


async def instance_of(request: Request) -> InstanceRow:
    instance_id = request.path_params["instance_id"]
    row = await console_of(request).read(lambda conn: instances_sql.instance_get(conn, instance_id))
    if row is None:
        raise HTTPException(404, f"no workflow instance {instance_id!r}")
    return row


def _text(form: FormData, name: str, default: str = "") -> str:
    value = form.get(name, default)
    if not isinstance(value, str):
        raise HTTPException(400, f"{name} must be text")
    if len(value) > MAX_FIELD_LENGTH:
        raise HTTPException(413, f"{name} is over {MAX_FIELD_LENGTH} characters")
    return value


# ------------------------------------------------------------------ cancel and retry


async def cancel_page(request: Request) -> Response:
    row = await instance_of(request)
    refused = steering.refusal("cancel", row)
    context = {"instance": row, "finished": refused is not None, "refused": refused}
    return render(request, "actions/cancel.html", context)


async def cancel(request: Request) -> Response:
    await require_csrf(request)
    row = await instance_of(request)
    who = console_who(request)
    outcome = await console_of(request).write(lambda conn: steering.cancel(conn, row, who))
    log_action(request, "cancel", instance_id=row.id, workflow=row.workflow_name, accepted=outcome.done)
    if not outcome.done:
        ended = outcome.status in TERMINAL_STATUSES  # the console's words for it, as before
        refused = f"it is already {outcome.status}: nothing to cancel" if ended else outcome.message
        context = {"instance": row, "finished": True, "refused": refused}
        return render(request, "actions/cancel.html", context, status=409)
    return RedirectResponse(instance_path(row.id), status_code=303)


async def retry_page(request: Request) -> Response:
    row = await instance_of(request)
    # the retry's own judgement, its saga's history included (a rollback already ran: refused)
    refused = await console_of(request).read(lambda conn: steering.refusal_now(conn, "retry", row))
    return render(request, "actions/retry.html", {"instance": row, "refused": refused})


async def retry(request: Request) -> Response:
    await require_csrf(request)
    row = await instance_of(request)
    who = console_who(request)
    # a saga's retry and the instance's: one decision, in one transaction with its record
    outcome = await console_of(request).write(lambda conn: steering.retry(conn, row, who))
    log_action(request, "retry", instance_id=row.id, workflow=row.workflow_name, retried=outcome.done)
    if not outcome.done:
        return render(request, "actions/retry.html", {"instance": row, "refused": outcome.message}, status=409)
    return RedirectResponse(instance_path(row.id), status_code=303)


# ------------------------------------------------------------------ start


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _parameters(wf: Workflow[Any]) -> str:
    """The workflow's signature without ``ctx``, its annotations resolved (a module with
    ``from __future__ import annotations`` has them as strings): what the input must fit."""
    hints = serialization.type_hints(wf.func)
    shown = []
    for param in list(serialization.signature(wf.func).parameters.values())[1:]:
        text = param.name
        if param.name in hints:
            text += f": {_type_name(hints[param.name])}"
        elif param.annotation is not inspect.Parameter.empty:
            text += f": {param.annotation}"
        if param.default is not inspect.Parameter.empty:
            text += f" = {param.default!r}"
        shown.append(("**" if param.kind is param.VAR_KEYWORD else "") + text)
    return f"({', '.join(shown)})"


def _example(wf: Workflow[Any]) -> str:
    """An input to start from: the single pydantic parameter's first JSON-schema example
    (as ``kenning up`` suggests it), else an empty object."""
    params = list(serialization.signature(wf.func).parameters.values())[1:]
    hints = serialization.type_hints(wf.func)
    if len(params) == 1:
        hint = hints.get(params[0].name)
        if isinstance(hint, type) and issubclass(hint, pydantic.BaseModel):
            examples = hint.model_json_schema().get("examples") or []
            if examples:
                return json.dumps(examples[0], indent=2)
    return "{}"


def _wrong_arguments(wf: Workflow[Any], arguments: dict[str, Any]) -> str | None:
    """Which argument does not fit its parameter's type, by name (pydantic's message on a
    lone value does not say which); None when each fits or is left to ``prepare_start``
    (unknown names, missing ones, a whole-input pydantic model)."""
    hints = serialization.type_hints(wf.func)
    wrong = []
    for name, value in arguments.items():
        if name not in hints:
            continue
        try:
            serialization.from_json(value, hints[name])
        except pydantic.ValidationError as error:
            details = "; ".join(str(e["msg"]) for e in error.errors())
            wrong.append(f"{name}: {details} (got {json.dumps(value)[:100]})")
    return "\n".join(wrong) or None


async def _workflow_names(request: Request) -> list[str]:
    """Every workflow a worker ever registered, and those the console loaded (--app)."""
    registered = await console_of(request).read(definitions_sql.definition_names)
    return sorted({*registered, *REGISTRY.workflows})


def _start_context(names: list[str], fields: dict[str, str], error: str | None = None) -> dict[str, Any]:
    wf = REGISTRY.workflows.get(fields["workflow"])
    return {
        "workflows": names,
        "fields": fields,
        "error": error,
        "parameters": _parameters(wf) if wf is not None else None,
        "checked": wf is not None,  # False: the console has not loaded its module, the input goes unchecked
    }


async def start_page(request: Request) -> Response:
    names = await _workflow_names(request)
    chosen = request.query_params.get("workflow", names[0] if names else "")
    wf = REGISTRY.workflows.get(chosen)
    fields = {
        "workflow": chosen,
        "input": _example(wf) if wf is not None else "{}",
        "instance_id": "",
        "idempotency_key": "",
    }
    return render(request, "actions/start.html", _start_context(names, fields))


async def start(request: Request) -> Response:
    """``step=review`` checks the form and shows what will start; ``step=confirm`` starts it.
    The instance id is fixed at review, so confirming twice starts one instance."""
    form = await require_csrf(request)
    fields = {name: _text(form, name).strip() for name in ("workflow", "input", "instance_id", "idempotency_key")}
    names = await _workflow_names(request)
    if form.get("step") == "edit":  # back from the review to the form, as it was
        return render(request, "actions/start.html", _start_context(names, fields))
    if fields["workflow"] not in names:
        error = (
            f"no workflow {fields['workflow']!r} was ever registered: a worker registers its workflows when it starts"
        )
        return render(request, "actions/start.html", _start_context(names, fields, error), status=422)
    try:
        arguments = json.loads(fields["input"] or "{}")
    except json.JSONDecodeError as error:
        message = f"the input is not valid JSON: {error}"
        return render(request, "actions/start.html", _start_context(names, fields, message), status=400)
    except RecursionError:
        message = TOO_DEEP.format(what="the input")
        return render(request, "actions/start.html", _start_context(names, fields, message), status=400)
    if not isinstance(arguments, dict):
        message = "the input must be a JSON object: the workflow's keyword arguments"
        return render(request, "actions/start.html", _start_context(names, fields, message), status=422)
    wf = REGISTRY.workflows.get(fields["workflow"])
    wrong = _wrong_arguments(wf, arguments) if wf is not None else None
    if wrong is not None:
        message = f"invalid input for workflow {fields['workflow']!r}: {wrong}"
        return render(request, "actions/start.html", _start_context(names, fields, message), status=422)
    try:
        prepared = prepare_start(
            fields["workflow"],
            arguments,
            instance_id=fields["instance_id"] or None,
            idempotency_key=fields["idempotency_key"] or None,
            flow_control=False,  # an operator's start runs at once, never folded into a burst
        )
    except InvalidInputError as error:
        return render(request, "actions/start.html", _start_context(names, fields, str(error)), status=422)
    if form.get("step") != "confirm":
        fields["instance_id"] = prepared.instance.instance_id
        fields["input"] = json.dumps(arguments, indent=2, ensure_ascii=False)
        return render(request, "actions/start_confirm.html", _start_context(names, fields))
    started = await console_of(request).write(lambda conn: start_on(conn, prepared, known=set(), registered=[]))
    assert started is not None  # only a cron tick's start (not_before) is ever refused
    log_action(request, "start", instance_id=started.instance_id, workflow=fields["workflow"], created=started.created)
    # the id (or the idempotency key) was taken: that instance, saying nothing new started
    suffix = "" if started.created else "?existed=1"
    return RedirectResponse(instance_path(started.instance_id) + suffix, status_code=303)


# ------------------------------------------------------------------ send


def _event(fields: dict[str, str]) -> NewEvent:
    """The form's CloudEvent, checked as the ingress checks one; ValueError says what is wrong."""
    if not fields["type"]:
        raise ValueError("the event needs a type, e.g. order.created")
    for name in ("id", "source"):
        if len(fields[name]) > MAX_ID_LENGTH:
            raise ValueError(f"{name} is over {MAX_ID_LENGTH} characters")
    try:
        data = json.loads(fields["data"]) if fields["data"] else None
    except json.JSONDecodeError as error:
        raise ValueError(f"the data is not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError(TOO_DEEP.format(what="the data")) from None
    attributes: dict[str, Any] = {
        "specversion": "1.0",
        "id": fields["id"],
        "source": fields["source"],
        "type": fields["type"],
    }
    if fields["subject"]:
        attributes["subject"] = fields["subject"]
    if data is not None:
        attributes["datacontenttype"] = "application/json"
    reserved = reserved_attribute_error(fields["type"], fields["source"])
    if reserved is not None:
        raise ValueError(reserved)
    reason = serialization.unstorable_reason({"attributes": attributes, "data": data})
    if reason is not None:
        raise ValueError(f"the event cannot be stored: {reason}")
    try:  # the CloudEvents SDK's validation, as the ingress and kenning send apply it
        CloudEvent(dict(attributes), data)  # a copy: the SDK fills in attributes of its own
    except BaseCloudEventException as error:
        raise ValueError(f"not a valid CloudEvent: {' '.join(str(error).split())}") from None
    return NewEvent(
        source=fields["source"], event_id=fields["id"], event_type=fields["type"], attributes=attributes, data=data
    )


async def send_page(request: Request) -> Response:
    fields = {"type": request.query_params.get("type", ""), "source": SEND_SOURCE, "id": "", "subject": "", "data": ""}
    return render(request, "actions/send.html", {"fields": fields, "error": None})


async def send(request: Request) -> Response:
    """``step=review`` checks the event and shows it; ``step=confirm`` writes it to the
    inbox. The id is fixed at review, so confirming twice stores one event."""
    form = await require_csrf(request)
    fields = {name: _text(form, name).strip() for name in ("type", "source", "id", "subject", "data")}
    fields["source"] = fields["source"] or SEND_SOURCE
    fields["id"] = fields["id"] or str(uuid.uuid4())
    try:
        event = _event(fields)
    except ValueError as error:
        return render(request, "actions/send.html", {"fields": fields, "error": str(error)}, status=422)
    if form.get("step") != "confirm":
        if event.data is not None:
            fields["data"] = json.dumps(event.data, indent=2, ensure_ascii=False)
        return render(request, "actions/send_confirm.html", {"fields": fields})
    (stored,) = await console_of(request).read(lambda conn: inbox_insert_events(conn, [event]))
    log_action(
        request, "send", event_type=event.event_type, source=event.source, event_id=event.event_id, stored=stored
    )
    return RedirectResponse("/events/inbox?sent=1" if stored else "/events/inbox?sent=0", status_code=303)


def routes() -> list[BaseRoute]:
    return [
        Route("/instances/{instance_id:path}/cancel", cancel_page, methods=["GET"]),
        Route("/instances/{instance_id:path}/cancel", cancel, methods=["POST"]),
        Route("/instances/{instance_id:path}/retry", retry_page, methods=["GET"]),
        Route("/instances/{instance_id:path}/retry", retry, methods=["POST"]),
        Route("/start", start_page, methods=["GET"]),
        Route("/start", start, methods=["POST"]),
        Route("/events/send", send_page, methods=["GET"]),
        Route("/events/send", send, methods=["POST"]),
    ]
