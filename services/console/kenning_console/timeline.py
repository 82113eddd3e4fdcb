"""One instance's history as a timeline: each recorded step with its start, duration,
attempts and outcome (as its worker measured them for a step that ran, migration 0007;
else, and for steps recorded before it, the start is the record before it and the
duration runs to the step's record);
the steps it is retrying now (failed attempts counted, no record yet: how many, since
when, the last error, and when the next attempt is due if the back-off released it); the
waits and timers it is on now (with their ``match`` and due time); the CloudEvents it
received (their attributes, from the ``EventReceived`` record) and sent (its outbox rows);
its compensations. Pure: rows in, items out.

The rows' values come bounded (``kenning.storage.console``): one too large to show whole is
an item's ``values`` entry (a preview and its download), not part of its ``details``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kenning import codecs
from kenning.core.names import (
    ACTIVITY_COMPLETED,
    ACTIVITY_FAILED,
    COMPENSATION_EXECUTED,
    COMPENSATION_FAILED,
    EVENT_RECEIVED,
    EVENT_TIMEOUT,
    PATCH_MARKER,
    TIMER_EXPIRED,
    VALUE_PUBLISHED,
)
from kenning_console.values import Shown, large

# outcome -> the marker's class: ok (green), bad (red), wait (amber), "" (grey)
TONE = {
    "completed": "ok",
    "received": "ok",
    "fired": "ok",
    "compensated": "ok",
    "sent": "ok",
    "published": "ok",
    "failed": "bad",
    "timed out": "bad",
    "compensation failed": "bad",
    "dead": "bad",
    "waiting": "wait",
    "pending": "wait",
    "retrying": "wait",
}
CLOUDEVENT_ATTRIBUTES = ("id", "source", "type", "subject", "time", "datacontenttype")


@dataclass
class Item:
    kind: str  # activity, event, timer, timeout, compensation, wait, sent, marker
    name: str
    outcome: str
    at: datetime | None  # recorded (or, for what is pending, registered)
    step_id: str = ""
    started: datetime | None = None
    run_seconds: float | None = None  # measured by the worker; else the duration is at - started
    attempts: int | None = None
    last_error: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # shown as JSON
    attributes: dict[str, Any] = field(default_factory=dict)  # a CloudEvent's
    match: Any = None
    due_at: Any = None
    fired_at: Any = None
    error: dict[str, Any] | None = None
    values: dict[str, Shown] = field(default_factory=dict)  # too large for details: previews

    @property
    def tone(self) -> str:
        return TONE.get(self.outcome, "")

    @property
    def duration(self) -> float | None:
        if self.run_seconds is not None:
            return self.run_seconds
        if self.started is None or self.at is None:
            return None
        return max(0.0, (self.at - self.started).total_seconds())


def _counted(entry: Any) -> tuple[int | None, str]:
    """A step's entry in the instance's ``attempts``: its failed attempts and last error."""
    if not isinstance(entry, dict):
        return None, ""
    count = entry.get("attempts")
    return (int(count) if isinstance(count, int) else None), str(codecs.shown(entry.get("last_error")) or "")


def _history_item(row: Any, instance: Any) -> Item:
    big = large(row, "payload", getattr(instance, "id", ""), "step", row.seq)
    # too large: what is left without its result or data (an event's attributes, an
    # error's type and message), if that is small
    payload = row.payload if big is None else getattr(row, "payload_rest", None)
    payload = payload if isinstance(payload, dict) else {}
    attempts, last_error = _counted((instance.attempts or {}).get(row.step_id))
    base: dict[str, Any] = {
        "values": {"record": big} if big is not None else {},
        "step_id": row.step_id,
        "at": row.created_at,
        # the record's (0007); an older row's step only if it still has attempts counted
        # on the instance (a record clears them, so this is rarely anything)
        "attempts": row.attempts or attempts,
        "last_error": last_error,
        "started": row.started_at,
        "run_seconds": row.run_seconds,
    }
    if row.kind == ACTIVITY_COMPLETED:
        details = {"result": payload.get("result")} if big is None else {}
        return Item("activity", row.step_name, "completed", details=details, **base)
    if row.kind == ACTIVITY_FAILED:
        return Item("activity", row.step_name, "failed", error=payload, **base)
    if row.kind == EVENT_RECEIVED:
        attributes = {name: payload.get(name) for name in CLOUDEVENT_ATTRIBUTES if payload.get(name) is not None}
        attributes.update(payload.get("extensions") or {})
        details = {"data": payload.get("data")} if big is None else {}
        return Item("event", row.step_name, "received", attributes=attributes, details=details, **base)
    if row.kind == EVENT_TIMEOUT:
        return Item("timeout", row.step_name, "timed out", details=payload, **base)
    if row.kind == TIMER_EXPIRED:
        return Item(
            "timer", row.step_name, "fired", due_at=payload.get("due_at"), fired_at=payload.get("fired_at"), **base
        )
    if row.kind == COMPENSATION_EXECUTED:
        return Item("compensation", row.step_name, "compensated", details=payload, **base)
    if row.kind == COMPENSATION_FAILED:
        return Item("compensation", row.step_name, "compensation failed", error=payload, **base)
    if row.kind == PATCH_MARKER:
        return Item("marker", row.step_name, "patched", details=payload, **base)
    if row.kind == VALUE_PUBLISHED:  # publish_value, set_status: the value is in its own table
        return Item("value", row.step_name, "published", details=payload, **base)
    return Item(row.kind, row.step_name, row.kind, details=payload, **base)  # a kind this console predates


def _retrying(instance: Any, recorded: set[str], compensations: list[Any]) -> list[Item]:
    """Steps with failed attempts counted on the instance and no record yet: being retried
    (inline by a worker, or released for a back-off: then ``due_at`` is the next attempt)."""
    functions = {f"compensation:{row.comp_id}": row.function_name for row in compensations}
    items = []
    for step_id, entry in (instance.attempts or {}).items():
        if step_id in recorded or not isinstance(entry, dict):
            continue
        compensation = step_id in functions
        attempts, last_error = _counted(entry)
        first = entry.get("first_failed_at")
        items.append(
            Item(
                "compensation" if compensation else "activity",
                # a step id is "<name>:<n>" unless the code named it
                functions[step_id] if compensation else step_id.rpartition(":")[0] or step_id,
                "retrying",
                datetime.fromisoformat(first) if isinstance(first, str) else None,
                step_id=step_id,
                attempts=attempts,
                last_error=last_error,
                due_at=instance.available_at if instance.status == "pending" else None,
            )
        )
    return items


def timeline(
    *,
    instance: Any,
    history: list[Any],
    compensations: list[Any],
    waits: list[Any],
    timers: list[Any],
    sent: list[Any],
    now: bool = True,
    previous: datetime | None = None,
) -> list[Item]:
    """Everything that happened to ``instance`` and what it waits on, in time order.

    A page of a long history passes its rows, the other rows of its time range, the record
    before its first step (``previous``: the first step's start when not measured), and
    ``now=False`` unless it is the last page: what is being retried belongs on that one."""
    id_ = getattr(instance, "id", "")
    items = [_history_item(row, instance) for row in history]
    previous = previous or instance.started_at or instance.created_at
    for item in items:  # not measured: a step starts when the record before it was written
        if item.started is None:
            item.started = previous if previous is not None and item.at is not None and previous <= item.at else None
        previous = item.at or previous
    if now:
        items += _retrying(instance, {row.step_id for row in history}, compensations)
    for row in sent:
        data = large(row, "data", id_, "sent", row.id)
        items.append(
            Item(
                "sent",
                row.event_type,
                {"published": "published", "pending": "pending", "failed": "retrying"}.get(row.status, row.status),
                row.created_at,
                attempts=row.attempts or None,
                last_error=row.last_error or "",
                attributes={
                    "id": row.id,
                    "source": row.source,
                    "type": row.event_type,
                    **({"subject": row.subject} if row.subject else {}),
                    **({"datacontenttype": row.content_type} if row.content_type else {}),
                    **(row.extensions or {}),
                },
                details={} if data is not None else {"data": row.data} if not row.binary else {"data": "(binary)"},
                values={"data": data} if data is not None else {},
                fired_at=row.published_at,
            )
        )
    for row in waits:
        match = large(row, "match", id_, "match", row.step_id)
        items.append(
            Item(
                "wait",
                row.step_name,
                "waiting",
                row.created_at,
                step_id=row.step_id,
                match=row.match,
                due_at=row.timeout_at,
                details={"event type": row.event_type},
                values={"match": match} if match is not None else {},
            )
        )
    for row in timers:
        items.append(Item("timer", row.step_name, "waiting", row.created_at, step_id=row.step_id, due_at=row.due_at))
    done = {item.step_id for item in items if item.kind == "compensation"}
    for row in compensations:  # registered but not run (yet, or ever: the instance succeeded)
        # (its record may be on another page of the history)
        if f"compensation:{row.comp_id}" not in done and getattr(row, "ran_kind", None) is None:
            big = {
                name: value
                for name in ("args", "kwargs")
                if (value := large(row, name, id_, name, row.comp_id)) is not None
            }
            items.append(
                Item(
                    "compensation",
                    row.function_name,
                    "registered",
                    row.created_at,
                    step_id=row.comp_id,
                    details={name: getattr(row, name) for name in ("args", "kwargs") if name not in big},
                    values=big,
                )
            )
    far = datetime.max.replace(tzinfo=instance.created_at.tzinfo)
    items.sort(key=lambda item: item.at or far)
    return items
