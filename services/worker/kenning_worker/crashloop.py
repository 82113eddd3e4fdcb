"""Crash loops: an instance whose runs keep dying without progress (an activity that
kills its process, standing in for an OOM kill or a segfault) is parked by the claim
itself (``storage.instances``) as failed with reason ``crash_loop``, and never handed
out again until an operator runs ``kenning instances retry`` (or ``cancel``). This module reports what
the claim parked: an error-level line, since an operator must look, and the failure
hook, as for any failed instance.

A run counts when its lease expired (the process died or stalled) and when it raised
unexpectedly (``instance.run_crashed``: the worker hands it back as an expired lease), in
both cases unless it recorded a step since its claim."""

from __future__ import annotations

from typing import Any

from kenning.app import App
from kenning.core.records import ParkedInstance
from kenning.hooks import call_hook
from kenning.storage.claims import crash_loop_message


class CrashLoopError(Exception):
    """The instance was parked: its runs kept ending without a clean end or a new step."""


async def report_parked(app: App, log: Any, parked: list[ParkedInstance], *, max_runs: int) -> None:
    """Log and hook each parked instance. The worker runs this in a task of its own: the
    hook may take any time, and the runs claimed beside the parked ones must not wait for
    it (their leases are renewed only once they run)."""
    for instance in parked:
        message = crash_loop_message(instance.id, instance.runs_without_progress, max_runs)
        log.error(
            "instance.crash_loop",
            instance_id=instance.id,
            workflow=instance.workflow_name,
            runs=instance.run_count,
            runs_without_progress=instance.runs_without_progress,
            max_runs=max_runs,
            hint=f"kenning instances retry {instance.id}",
        )
        await call_hook(app.hooks, "on_workflow_failed", instance.id, instance.workflow_name, CrashLoopError(message))
