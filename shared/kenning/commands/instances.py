"""``kenning instances list|show|cancel|retry``: look at and steer workflow instances."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from typing import Any

from kenning.commands.output import emit, emit_json, table
from kenning.core.names import COMPENSATION_EXECUTED, COMPENSATION_FAILED
from kenning.core.records import INSTANCE_STATUSES, InstanceRow
from kenning.db import Executor, connect
from kenning.errors import WorkflowNotFoundError
from kenning.runtime.config import add_database_options, add_logging_options, positive_int
from kenning.storage import children as children_sql
from kenning.storage import claims as claims_sql
from kenning.storage import definitions as definitions_sql
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql
from kenning.storage import progress as progress_sql
from kenning.storage import sagas as sagas_sql
from kenning.storage.children import ChildRow

HELP = "list, show, cancel and retry workflow instances"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="newest instances first")
    listing.add_argument("--status", choices=INSTANCE_STATUSES)
    listing.add_argument("--workflow", help="only this workflow name")
    listing.add_argument("--limit", type=positive_int, default=50)
    show = actions.add_parser("show", help="status, input, result or error, and the history timeline")
    show.add_argument("instance_id")
    cancel = actions.add_parser("cancel", help="cancel: compensate and end 'cancelled'")
    cancel.add_argument("instance_id")
    retry = actions.add_parser(
        "retry", help="re-run a failed instance from its last good step, or its compensations that failed"
    )
    retry.add_argument("instance_id")
    for sub in (listing, show, cancel, retry):
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        add_database_options(sub)
        add_logging_options(sub)


async def _run(args: argparse.Namespace) -> int:
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        async with database.transaction() as conn:
            if args.action == "list":
                rows = await instances_sql.instance_list(
                    conn, status=args.status, workflow_name=args.workflow, limit=args.limit
                )
                if args.json:
                    emit_json([asdict(r) for r in rows])
                else:
                    emit(
                        table(
                            ["id", "workflow", "status", "created", "finished"],
                            [(r.id, r.workflow_name, r.status, r.created_at, r.finished_at) for r in rows],
                        )
                    )
                return 0
            row = await instances_sql.instance_get(conn, args.instance_id)
            if row is None:
                raise WorkflowNotFoundError(f"no workflow instance {args.instance_id!r}")
            if args.action == "show":
                history = await history_sql.history_shown(conn, row.id)
                compensations = (await history_sql.compensations_load(conn, [row.id])).get(row.id, [])
                stuck_mark = await progress_sql.instance_stuck(conn, row.id)
                shown = {**asdict(row), "stuck_reason": stuck_mark.reason if stuck_mark else None}
                parent = await children_sql.parent_of(conn, row.id)
                children = await children_sql.children_of(conn, row.id)
                shown["parent_id"] = None if parent is None else parent[0]
                _show(args, shown, history, [asdict(c) for c in compensations], children)
                known = row.status != "pending" or await definitions_sql.definition_known(conn, row.workflow_name)
                if not known and not args.json:
                    emit(f"\nno worker has this workflow: no process ever registered {row.workflow_name!r}")
                if stuck_mark is not None and stuck_mark.reason and not args.json:  # the stuck check's verdict
                    emit(f"\nno way forward: {stuck_mark.reason} (see kenning why {row.id})")
                return 0
            if args.action == "cancel":
                outcome = await instances_sql.instance_request_cancel(conn, row.id)
                # the status the cancel met under its row lock, not the one read before it
                before, accepted = outcome if outcome is not None else (row.status, False)
                if args.json:
                    emit_json({"instance_id": row.id, "cancel_requested": accepted, "status": before})
                elif accepted:
                    emit(f"{row.id}: cancellation requested")
                else:
                    emit(f"{row.id}: too late to cancel: it already ended {before}")
                return 0 if accepted else 1
            retried = await retry_instance(conn, row)
            if args.json:
                emit_json({"instance_id": row.id, **retried})
            else:
                emit(f"{row.id}: {retried['message']}")
            return 0 if retried["retried"] else 1
    finally:
        await database.dispose()


async def retry_instance(conn: Executor, row: InstanceRow) -> dict[str, Any]:
    """Retry a failed instance (``kenning instances retry``, the console's retry):
    ``{"retried": bool, "message": str}``. A rollback stopped at a failed compensation
    runs its compensations not yet executed; any other failure re-runs from its history,
    its failed steps forgotten and their attempts reset; a crash-looped instance resumes
    as it was parked. Call it inside a transaction: two statements may run."""
    # a crash-looped instance resumes as it was parked, compensating ones included
    crash_loop = (row.error or {}).get("reason") == claims_sql.CRASH_LOOP
    rerun = None if crash_loop else await sagas_sql.saga_retry(conn, row.id)
    if rerun is not None:  # the rollback stopped at a failed compensation: finish it
        return {"retried": True, "message": f"compensating again; {rerun} failed compensation(s) will run again"}
    return await instances_sql.instance_retry(conn, row.id)


def _show(
    args: argparse.Namespace,
    row: dict[str, Any],
    history: list[dict[str, Any]],
    compensations: list[dict[str, Any]],
    children: list[ChildRow],
) -> None:
    for record in history:
        if record.get("payload_bytes") is not None:
            record["payload_bytes"] = f"<{len(record['payload_bytes'])} bytes>"
    _add_outcomes(compensations, history)
    if args.json:
        emit_json(
            {**row, "history": history, "compensations": compensations, "children": [asdict(c) for c in children]}
        )
        return
    emit(
        table(
            ["field", "value"],
            [
                ("id", row["id"]),
                ("workflow", row["workflow_name"]),
                ("status", row["status"]),
                ("input", row["input"]),
                ("result", row["result"]),
                ("error", (row["error"] or {}).get("message")),
                ("error type", (row["error"] or {}).get("type")),
                ("reason", (row["error"] or {}).get("reason")),
                ("runs", _runs(row)),
                ("created", row["created_at"]),
                ("finished", row["finished_at"]),
                ("lease owner", row["lease_owner"]),
                ("parent", row["parent_id"]),
            ],
        )
    )
    error = row["error"] or {}
    if error.get("reason") == claims_sql.CRASH_LOOP:  # in full, with what to do: the table cuts it
        emit(f"\n{error.get('message')}")
    emit("")
    emit(
        table(
            ["time", "kind", "step", "name", "attempts", "took"],
            [
                (h["created_at"], h["kind"], h["step_id"], h["step_name"], h["attempts"], _took(h["run_seconds"]))
                for h in history
            ],
        )
        if history
        else "no steps recorded yet"
    )
    if children:  # start_child: the children this instance started
        emit("")
        emit(
            table(
                ["child", "workflow", "status", "started at step", "on parent cancel"],
                [(c.id, c.workflow_name, c.status, c.parent_step, c.on_parent_cancel) for c in children],
            )
        )
    if compensations:
        emit("")
        emit(
            table(
                ["#", "compensation", "args", "kwargs", "outcome"],
                [(c["position"], c["function_name"], c["args"], c["kwargs"], c["outcome"]) for c in compensations],
            )
        )
        for c in compensations:  # in full: the table cuts long cells
            if c["error"]:
                emit(f"compensation #{c['position']} {c['function_name']} failed: {c['error']}")


def _took(seconds: float | None) -> str | None:
    """A step's last attempt's run time, as the console shows it."""
    return None if seconds is None else f"{seconds:.3f} s"


def _runs(row: dict[str, Any]) -> str:
    """How often it was claimed; and how many runs in a row died without a step, if any."""
    dead = row["runs_without_progress"]
    return f"{row['run_count']}" + (f" ({dead} in a row ended without a clean end or a step)" if dead else "")


def _add_outcomes(compensations: list[dict[str, Any]], history: list[dict[str, Any]]) -> None:
    """Each compensation's ``outcome`` (executed, failed, not run) and its ``error``."""
    recorded = {h["step_id"]: h for h in history}
    for comp in compensations:
        record = recorded.get(f"compensation:{comp['comp_id']}")
        kind = record["kind"] if record else None
        comp["outcome"] = {COMPENSATION_EXECUTED: "executed", COMPENSATION_FAILED: "failed"}.get(kind or "", "not run")
        payload = (record or {}).get("payload") or {}
        error_type = str(payload.get("type", "")).rpartition(".")[2]
        comp["error"] = f"{error_type}: {payload.get('message')}" if kind == COMPENSATION_FAILED else None


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
