"""``kenning instances list|show|cancel|retry|terminate|fork``: look at and steer workflow instances."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from kenning import codecs
from kenning.client.forks import ForkStepError
from kenning.commands import steering
from kenning.commands.output import emit, emit_json, table
from kenning.commands.start import json_object
from kenning.commands.steering import BATCH_SIZE
from kenning.core.names import COMPENSATION_EXECUTED, COMPENSATION_FAILED, COMPENSATION_SKIPPED
from kenning.core.published import parse_search_pair
from kenning.core.records import INSTANCE_STATUSES, InstanceRow
from kenning.db import Database, Executor, connect
from kenning.errors import UsageError, WorkflowNotFoundError
from kenning.hosting.appload import load_app
from kenning.hosting.config import add_database_options, add_logging_options, add_option, positive_int
from kenning.starting import InvalidInputError
from kenning.storage import children as children_sql
from kenning.storage import claims as claims_sql
from kenning.storage import definitions as definitions_sql
from kenning.storage import forks as forks_sql
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql
from kenning.storage import progress as progress_sql
from kenning.storage import published as published_sql
from kenning.storage import runs as runs_sql
from kenning.storage.children import ChildRow

HELP = (
    "list, show, cancel, retry and terminate workflow instances, one or by filter; skip a compensation; "
    "fork one from a step"
)

# cancel, retry and terminate: one instance by id, or every instance a filter selects
BULK_ACTIONS = {
    "cancel": "cancel: compensate and end 'cancelled'",
    "retry": "re-run a failed instance from its last good step, or its compensations that failed",
    "terminate": "end it now, 'failed', without compensating (its reason is recorded)",
}


def _time(text: str) -> datetime:
    """A ``--created-*`` time: ISO 8601, UTC when it names no zone."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: use 2025-01-31T14:00 (ISO 8601)") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _where(text: str) -> tuple[str, str]:
    """A ``--where`` pair: ``KEY=VALUE``, a search attribute and its text."""
    try:
        return parse_search_pair(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="newest instances first")
    listing.add_argument("--status", choices=INSTANCE_STATUSES)
    listing.add_argument("--workflow", help="only this workflow name")
    listing.add_argument("--limit", type=positive_int, default=50)
    listing.add_argument(
        "--where",
        action="append",
        type=_where,
        metavar="KEY=VALUE",
        help="only instances whose search attribute KEY is VALUE (@workflow(search_attributes=...)); repeat: all",
    )
    show = actions.add_parser("show", help="status, input, result or error, and the history timeline")
    show.add_argument("instance_id")
    subs = [listing, show]
    for name, help_text in BULK_ACTIONS.items():
        sub = actions.add_parser(name, help=help_text + "; by filter with no id")
        sub.add_argument("instance_id", nargs="?", help="one instance; without it, every instance the filter selects")
        sub.add_argument("--workflow", help="by filter: only this workflow")
        sub.add_argument("--status", action="append", choices=INSTANCE_STATUSES, help="by filter: repeat for several")
        sub.add_argument("--created-before", type=_time, metavar="TIME", help="by filter: created before (ISO 8601)")
        sub.add_argument("--created-after", type=_time, metavar="TIME", help="by filter: created at or after")
        sub.add_argument("--dry-run", action="store_true", help="by filter: print how many it selects, change nothing")
        sub.add_argument("--batch-size", type=positive_int, default=BATCH_SIZE, help="by filter: per transaction")
        sub.add_argument("--reason", required=name == "terminate", help="why: recorded in the action log")
        subs.append(sub)
    skip = actions.add_parser(
        "skip-compensation", help="record a failing compensation as skipped so the saga can end (with --reason)"
    )
    skip.add_argument("instance_id")
    skip.add_argument("--compensation", metavar="COMP_ID", help="which one (default: the one failing)")
    skip.add_argument("--reason", required=True, help="why: recorded in the history and the action log")
    subs.append(skip)
    fork = actions.add_parser(
        "fork",
        help="a new instance with this one's history before STEP, running today's code from STEP",
    )
    fork.add_argument("instance_id")
    fork.add_argument(
        "--from-step",
        required=True,
        metavar="STEP",
        help="the step to run again from: its number or step id as `kenning instances show` lists them",
    )
    fork.add_argument(
        "--input", metavar="JSON", help="keyword arguments as a JSON object: replace the input the replay sees"
    )
    add_option(
        fork,
        "--app",
        default="",
        help="optional: modules defining workflows, to check --input against the workflow",
    )
    fork.add_argument("--reason", help="why: recorded in the action log")
    subs.append(fork)
    for sub in subs:
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        add_database_options(sub)
        add_logging_options(sub)


def _filtered(args: argparse.Namespace) -> bool:
    """Whether a cancel, retry or terminate names a filter (and then no id)."""
    given = any(getattr(args, name, None) for name in ("workflow", "status", "created_before", "created_after"))
    if args.instance_id is not None and (given or args.dry_run):
        raise UsageError("give an instance id or a filter (--workflow, --status, --created-*), not both")
    if args.instance_id is None and not given:
        raise UsageError(
            f"name the instances to {args.action}: an id, or a filter (--workflow, --status, --created-before, "
            "--created-after)"
        )
    return args.instance_id is None


async def _bulk(database: Database, args: argparse.Namespace) -> int:
    selected = steering.bulk_filter(
        args.action,
        args.status,
        workflow=args.workflow,
        created_before=args.created_before,
        created_after=args.created_after,
    )
    result = await steering.bulk(
        database,
        args.action,
        selected,
        steering.cli_who(),
        reason=args.reason,
        dry_run=args.dry_run,
        batch_size=args.batch_size,
    )
    if args.json:
        emit_json({"action": args.action, "dry_run": args.dry_run, "filter": selected.shown(), **asdict(result)})
    elif args.dry_run:
        emit(f"{result.matched} instance(s) match: {args.action} would apply to them (dry run: nothing changed)")
    else:
        done = {"cancel": "asked to cancel", "retry": "retried", "terminate": "terminated"}[args.action]
        emit(f"{result.affected} of {result.matched} matching instance(s) {done} in {result.batches} batch(es)")
    return 0


async def _run(args: argparse.Namespace) -> int:
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        if args.action in BULK_ACTIONS and _filtered(args):
            return await _bulk(database, args)
        async with database.transaction() as conn:
            if args.action == "list":
                rows = await _list(conn, args)
                if args.json:
                    emit_json([asdict(r) for r in rows])
                else:
                    emit(
                        table(
                            ["id", "workflow", "status", "run", "created", "finished"],
                            [(r.id, r.workflow_name, r.status, r.run, r.created_at, r.finished_at) for r in rows],
                        )
                    )
                return 0
            row = await instances_sql.instance_get(conn, args.instance_id)
            if row is None:
                raise WorkflowNotFoundError(f"no workflow instance {args.instance_id!r}")
            if args.action == "fork":
                return await _fork(conn, args, row)
            if args.action == "show":
                history = await history_sql.history_shown(conn, row.id)
                compensations = (await history_sql.compensations_load(conn, [row.id])).get(row.id, [])
                stuck_mark = await progress_sql.instance_stuck(conn, row.id)
                shown = {**asdict(row), "stuck_reason": stuck_mark.reason if stuck_mark else None}
                parent = await children_sql.parent_of(conn, row.id)
                children = await children_sql.children_of(conn, row.id)
                shown["values"] = {v.key: v.value for v in await published_sql.values_of(conn, row.id)}
                shown["parent_id"] = None if parent is None else parent[0]
                shown["chain"] = [asdict(r) for r in await runs_sql.runs_list(conn, row.id)]
                shown["forks"] = [asdict(f) for f in await forks_sql.forks_of(conn, row.id)]
                _show(args, shown, history, [asdict(c) for c in compensations], children)
                known = row.status != "pending" or await definitions_sql.definition_known(conn, row.workflow_name)
                if not known and not args.json:
                    emit(f"\nno worker has this workflow: no process ever registered {row.workflow_name!r}")
                if stuck_mark is not None and stuck_mark.reason and not args.json:  # the stuck check's verdict
                    emit(f"\nno way forward: {stuck_mark.reason} (see kenning why {row.id})")
                return 0
            outcome = await _act(conn, args, row)
            if args.json and args.action == "cancel":
                emit_json({"instance_id": row.id, "cancel_requested": outcome.done, "status": outcome.status})
            elif args.json:
                done = {"retry": "retried", "terminate": "terminated"}.get(args.action, "skipped")
                emit_json({"instance_id": row.id, done: outcome.done, "message": outcome.message})
            else:
                emit(f"{row.id}: {outcome.message}")
            return 0 if outcome.done else 1
    finally:
        await database.dispose()


async def _fork(conn: Executor, args: argparse.Namespace, row: InstanceRow) -> int:
    """``fork``: the fork's id and what it kept; a step it does not have or an input its
    workflow refuses is the operator's mistake (exit 2)."""
    arguments = None
    if args.input is not None:  # read here, not by argparse: a mistake is one line, not the usage
        try:
            arguments = json_object(args.input)
        except argparse.ArgumentTypeError as error:
            raise UsageError(f"--input: {error}") from None
        if args.app.strip():
            load_app(args.app)  # its workflows register themselves: the input is checked against them
    try:
        forked = await steering.fork(conn, row, steering.cli_who(), args.from_step, arguments, args.reason)
    except (ForkStepError, InvalidInputError) as error:
        raise UsageError(f"cannot fork {row.id}: {error}") from None
    if args.json:
        emit_json({"instance_id": row.id, **asdict(forked), "message": forked.said()})
    else:
        emit(f"{row.id}: {forked.said()}")
    return 0


async def _list(conn: Executor, args: argparse.Namespace) -> list[InstanceRow]:
    """``list``, by its ``--where`` search attributes when it names some."""
    if not args.where:
        return await instances_sql.instance_list(
            conn, status=args.status, workflow_name=args.workflow, limit=args.limit
        )
    where = dict(args.where)
    if len(where) < len(args.where):
        raise UsageError("--where names a search attribute twice: an instance holds one value of each")
    rows = await published_sql.instance_list_where(
        conn, where, status=args.status, workflow_name=args.workflow, limit=args.limit
    )
    if not rows:  # nothing found: a key no instance holds is a mistake to name, not an empty list
        unheld = sorted(set(where) - await published_sql.search_keys_held(conn, list(where)))
        if unheld:
            raise UsageError(
                f"--where: no instance holds search attribute {unheld[0]!r}; a workflow declares its keys "
                "in @workflow(search_attributes=...) and sets them at its start or with publish_value"
            )
    return rows


async def _act(conn: Executor, args: argparse.Namespace, row: InstanceRow) -> steering.Outcome:
    who = steering.cli_who()
    if args.action == "cancel":
        return await steering.cancel(conn, row, who)
    if args.action == "retry":
        return await steering.retry(conn, row, who)
    if args.action == "terminate":
        return await steering.terminate(conn, row, who, args.reason)
    return await steering.skip_compensation(conn, row, who, args.reason, args.compensation)


def _show(
    args: argparse.Namespace,
    row: dict[str, Any],
    history: list[dict[str, Any]],
    compensations: list[dict[str, Any]],
    children: list[ChildRow],
) -> None:
    # opened with this process's key; "encrypted" in place of each payload without it
    row = {**row, **{name: codecs.shown(row[name]) for name in ("input", "result", "error")}}
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
                ("run", row["run"]),
                ("runs", _runs(row)),
                ("pinned to", row["pinned_version"]),
                ("created", row["created_at"]),
                ("finished", row["finished_at"]),
                ("lease owner", row["lease_owner"]),
                ("parent", row["parent_id"]),
                ("forked from", _forked_from(row)),
            ],
        )
    )
    error = row["error"] or {}
    if error.get("reason") in (claims_sql.CRASH_LOOP, "terminated"):  # in full: the table cuts it
        emit(f"\n{error.get('message')}")
    emit("")
    emit(
        table(
            ["#", "time", "kind", "step", "name", "attempts", "took"],
            [
                (n, h["created_at"], h["kind"], h["step_id"], h["step_name"], h["attempts"], _took(h["run_seconds"]))
                for n, h in enumerate(history, start=1)  # the numbers kenning instances fork --from-step takes
            ],
        )
        if history
        else "no steps recorded yet"
    )
    if row["values"]:  # publish_value, set_status: the latest per key
        emit("")
        emit(table(["published", "value"], list(row["values"].items())))
    if len(row["chain"]) > 1:  # continue_as_new: the chain of runs, the current one last
        emit("")
        emit(
            table(
                ["run", "started", "ended", "steps", "ended as"],
                [(r["run"], r["started_at"], r["ended_at"], r["steps"], r["ended"]) for r in row["chain"]],
            )
        )
    if children:  # start_child: the children this instance started
        emit("")
        emit(
            table(
                ["child", "workflow", "status", "started at step", "on parent cancel"],
                [(c.id, c.workflow_name, c.status, c.parent_step, c.on_parent_cancel) for c in children],
            )
        )
    for fork in row["forks"]:  # kenning instances fork: the instances made from this one
        emit(f"forked to {fork['id']} at step {fork['step']} ({fork['status']})")
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
                said = "was" if c["outcome"] == "skipped" else "failed:"
                emit(f"compensation #{c['position']} {c['function_name']} {said} {c['error']}")


def _forked_from(row: dict[str, Any]) -> str | None:
    """A fork's original and the step it was forked at."""
    return None if row["forked_from"] is None else f"{row['forked_from']} at step {row['forked_from_step']}"


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
        outcomes = {COMPENSATION_EXECUTED: "executed", COMPENSATION_FAILED: "failed", COMPENSATION_SKIPPED: "skipped"}
        comp["outcome"] = outcomes.get(kind or "", "not run")
        payload = (record or {}).get("payload") or {}
        error_type = str(payload.get("type", "")).rpartition(".")[2]
        comp["error"] = f"{error_type}: {payload.get('message')}" if kind == COMPENSATION_FAILED else None
        if kind == COMPENSATION_SKIPPED:  # the operator's reason, shown where an error would be
            comp["error"] = f"skipped by an operator: {payload.get('reason')}"


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
