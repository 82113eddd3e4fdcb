"""Scheduled workflows, ``@workflow(schedule="*/5 * * * *", timezone="Europe/Paris")``.

The scheduler process starts one instance per cron tick. The tick, in UTC, names the
instance and is its idempotency key, so a tick starts exactly once however many
schedulers run. Scheduled workflows take no arguments: the tick is in the instance's
``idempotency_key`` (``Client.status``).

``overlap=`` says what a tick does while the instance the schedule started last has not
finished: ``"allow"`` (the default) starts it anyway, ``"skip"`` skips it, ``"buffer_one"``
starts the latest such tick once that instance finishes (at most one waits; the others
are skipped). ``kenning schedules`` lists, pauses, resumes, triggers and backfills them.
"""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from kenning.core.cron import CronError, CronSchedule
from kenning.errors import ConfigurationError

if TYPE_CHECKING:
    from kenning.registry import Registry
    from kenning.workflow import Workflow


OVERLAP_POLICIES = ("allow", "skip", "buffer_one")


def check_overlap(workflow_name: str, overlap: str | None, schedule: str | None) -> str:
    """The workflow's overlap policy (``"allow"`` when not given), or a
    ``ConfigurationError`` naming the workflow."""
    if overlap is None:
        return "allow"
    if schedule is None:
        raise ConfigurationError(f"workflow {workflow_name!r}: overlap= needs schedule=")
    if overlap not in OVERLAP_POLICIES:
        raise ConfigurationError(
            f"workflow {workflow_name!r}: overlap={overlap!r} must be one of {', '.join(OVERLAP_POLICIES)}"
        )
    return overlap


def trigger_key(moment: datetime) -> str:
    """The idempotency key of an operator's trigger: ``2026-01-31T09:30:12.345Z-trigger``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z-trigger"


def tick_key(tick: datetime) -> str:
    """The idempotency key of a tick: ``2026-01-31T09:30:00Z``."""
    return tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_instance_id(workflow_name: str, tick: datetime) -> str:
    """The instance id of a tick: ``nightly_report@2026-01-31T09:30:00Z``."""
    return f"{workflow_name}@{tick_key(tick)}"


def parse_schedule(workflow_name: str, expression: str, timezone: str | None) -> CronSchedule:
    """The workflow's schedule, or a ``ConfigurationError`` naming the workflow."""
    try:
        return CronSchedule.parse(expression, timezone)
    except CronError as error:
        raise ConfigurationError(f"workflow {workflow_name!r}: invalid schedule: {error}") from None


def next_tick_of(expression: str, timezone: str, now: datetime) -> datetime | None:
    """The tick after ``now`` of a schedule as its row stores it; None if this version
    cannot read the expression (a newer scheduler wrote it)."""
    try:
        return CronSchedule.parse(expression, timezone).next_after(now)
    except CronError:
        return None


def ticks_between(cron: CronSchedule, first: datetime, last: datetime, limit: int) -> list[datetime]:
    """The ticks from ``first`` to ``last``, both included, at most ``limit + 1`` (one
    more than the caller allows: it can say there are too many)."""
    found: list[datetime] = []
    moment = first - timedelta(microseconds=1)
    while len(found) <= limit:
        try:
            tick = cron.next_after(moment)
        except CronError:
            break
        if tick > last:
            break
        found.append(tick)
        moment = tick
    return found


def scheduled_workflows(registry: Registry) -> list[Workflow[Any]]:
    """The registry's workflows that have a schedule, checked to be startable without
    arguments."""
    found: list[Workflow[Any]] = []
    for wf in sorted(registry.workflows.values(), key=lambda w: w.name):
        if wf.cron is None:
            continue
        params = list(inspect.signature(wf.func).parameters.values())[1:]  # after ctx
        required = [
            p.name
            for p in params
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise ConfigurationError(
                f"scheduled workflow {wf.name!r} must take no arguments besides ctx "
                f"(or give them defaults); it requires {', '.join(required)}"
            )
        found.append(wf)
    return found
