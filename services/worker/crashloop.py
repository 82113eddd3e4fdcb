"""Crash loops: an instance whose runs keep dying without progress (an activity that
kills its process, standing in for an OOM kill or a segfault) is parked by the claim
itself (``storage.instances``) as failed with reason ``crash_loop``, and never handed
out again until an operator runs ``kenning instances retry``. This module reports what
the claim parked: an error-level line, since an operator must look, and the failure
hook, as for any failed instance."""

from __future__ import annotations

from typing import Any

from kenning.app import App
from kenning.hooks import call_hook
from kenning.storage.records import ParkedInstance


class CrashLoopError(Exception):
    """The instance was parked: its runs kept ending without a clean end or a new step."""


async def report_parked(app: App, log: Any, parked: list[ParkedInstance], *, max_runs: int) -> None:
    for instance in parked:
        message = (
            f"crash loop: {instance.runs_without_progress} runs in a row ended without finishing cleanly "
            f"or recording a step (--max-runs {max_runs}); fix the cause, then run "
            f"kenning instances retry {instance.id}"
        )
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
