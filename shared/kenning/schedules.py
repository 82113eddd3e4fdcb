"""Scheduled workflows, ``@workflow(schedule="*/5 * * * *", timezone="Europe/Paris")``.

The scheduler process starts one instance per cron tick. The tick, in UTC, names the
instance and is its idempotency key, so a tick starts exactly once however many
schedulers run. Scheduled workflows take no arguments: the tick is in the instance's
``idempotency_key`` (``Client.status``).
"""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kenning.core.cron import CronError, CronSchedule
from kenning.errors import ConfigurationError

if TYPE_CHECKING:
    from kenning.registry import Registry
    from kenning.workflow import Workflow


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
