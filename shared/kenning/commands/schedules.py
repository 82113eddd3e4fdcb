"""``kenning schedules list|pause|resume|trigger|backfill``: the operator's cron schedules.

``list`` shows each schedule a scheduler declared: its expression and zone, its overlap
policy, whether it is paused (and why), the last tick decided, the next one due and the
instance it started last. ``pause NAME --reason`` stops its ticks (the instances running
go on); ``resume NAME`` starts with the next tick, none of those that fell while paused.
``trigger NAME`` starts one run now. ``backfill NAME --from --to`` starts every tick of
the range that has not run (``--dry-run``: how many first); a tick that ran is not
started again, whoever asks. Each action but ``list`` and a dry run is recorded in the
operator action log (``kenning actions list``), the console's as the CLI's: a pause,
resume or trigger in the transaction that does it, a backfill before its first batch
and then batch by batch.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from kenning.commands.output import emit, emit_json, table
from kenning.commands.steering import Who, cli_who
from kenning.core.cron import CronError, CronSchedule
from kenning.core.records import NewInstance, StartOutcome
from kenning.core.suggest import did_you_mean
from kenning.db import Database, Executor, connect
from kenning.db.errors import sqlstate
from kenning.errors import KenningError, UsageError
from kenning.hosting.config import add_database_options, add_logging_options
from kenning.schedules import next_tick_of, tick_instance_id, tick_key, ticks_between, trigger_key
from kenning.storage import actions as actions_sql
from kenning.storage import instances as instances_sql
from kenning.storage import schedules as schedules_sql
from kenning.storage.actions import OperatorAction
from kenning.storage.schedules import ScheduleRow

HELP = "list cron schedules; pause, resume or trigger one; backfill its missed ticks"
MAX_BACKFILL = 10_000  # ticks one backfill starts at most: a wider range is surely a typo
_BATCH = 500  # ticks per insert statement: each commits on its own, no long transaction
# Longest an operator's command waits for a lock (a schedule's row held by another session;
# a scheduler's tick holds it milliseconds, and 5 s at most if that scheduler stalls).
LOCK_WAIT_SECONDS = 5.0
_LOCK_NOT_AVAILABLE = "55P03"


def moment(text: str) -> datetime:
    """An ISO 8601 time (``2026-01-31T09:30:00Z``); without an offset it is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time such as 2026-01-31T09:30:00Z") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every schedule: expression, overlap, paused, last and next tick")
    pause = actions.add_parser("pause", help="no tick of the schedule starts until resumed")
    pause.add_argument("name", help="the scheduled workflow")
    pause.add_argument("--reason", default=None, help="why, shown by list and the console")
    resume = actions.add_parser("resume", help="ticks start again, from the next one")
    resume.add_argument("name", help="the scheduled workflow")
    trigger = actions.add_parser("trigger", help="start one run of the schedule now")
    trigger.add_argument("name", help="the scheduled workflow")
    backfill = actions.add_parser("backfill", help="start the ticks of a time range that did not run")
    backfill.add_argument("name", help="the scheduled workflow")
    backfill.add_argument("--from", dest="first", type=moment, required=True, help="first tick time (ISO 8601)")
    backfill.add_argument("--to", dest="last", type=moment, required=True, help="last tick time, included")
    backfill.add_argument("--dry-run", action="store_true", help="count the ticks and start none")
    for sub in (listing, pause, resume, trigger, backfill):
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        add_database_options(sub)
        add_logging_options(sub)


def schedule_view(row: ScheduleRow) -> dict[str, Any]:
    """A schedule as ``list --json`` and the console show it; ``next_tick`` is computed
    from the expression on the database clock (None while paused)."""
    view = asdict(row)
    view.pop("now")
    view["next_tick"] = None if row.paused else next_tick_of(row.expression, row.timezone, row.now)
    return view


async def _schedule(conn: Executor, name: str) -> ScheduleRow:
    row = await schedules_sql.schedule_get(conn, name)
    if row is None:
        names = [r.workflow_name for r in await schedules_sql.schedules_list(conn)]
        raise UsageError(
            f"no schedule {name!r}{did_you_mean(name, names)}: a scheduler declares the schedules of its "
            "--app's workflows when it starts; kenning schedules list shows them"
        )
    return row


def _cron(row: ScheduleRow) -> CronSchedule:
    try:
        return CronSchedule.parse(row.expression, row.timezone)
    except CronError as error:
        raise UsageError(f"schedule {row.workflow_name!r}: {error}") from None


async def _list(conn: Executor, args: argparse.Namespace) -> None:
    views = [schedule_view(row) for row in await schedules_sql.schedules_list(conn)]
    if args.json:
        emit_json(views)
        return
    rows = [
        (
            v["workflow_name"],
            v["expression"] if v["timezone"] == "UTC" else f"{v['expression']} ({v['timezone']})",
            v["overlap"],
            ("yes: " + v["paused_reason"]) if v["paused"] and v["paused_reason"] else "yes" if v["paused"] else "no",
            v["last_tick"],
            v["next_tick"],
            None if v["last_instance_id"] is None else f"{v['last_instance_id']} ({v['last_instance_status'] or '?'})",
        )
        for v in views
    ]
    emit(table(["schedule", "expression", "overlap", "paused", "last tick", "next tick", "last instance"], rows))


async def _record(
    conn: Executor, who: Who, action: str, row: ScheduleRow, *, affected: int, reason: str | None = None, **details: Any
) -> int:
    record = OperatorAction(
        action=f"schedule-{action}",
        origin=who.origin,
        actor=who.actor,
        target=row.workflow_name,
        affected=affected,
        reason=reason,
        details=details,
    )
    return await actions_sql.action_record(conn, record)


async def set_paused(conn: Executor, row: ScheduleRow, who: Who, *, paused: bool, reason: str | None = None) -> None:
    """Pause or resume ``row``'s schedule (the command's and the console's), recorded in
    the caller's transaction."""
    # resumed, it starts from the next tick: those that fell while paused count as decided
    skip_through = None if paused else _cron(row).latest_at_or_before(row.now)
    await schedules_sql.schedule_set_paused(
        conn, row.workflow_name, paused=paused, reason=reason if paused else None, skip_through=skip_through
    )
    await _record(conn, who, "pause" if paused else "resume", row, affected=1, reason=reason if paused else None)


async def trigger(conn: Executor, row: ScheduleRow, who: Who) -> tuple[str, bool]:
    """Start one run of ``row``'s schedule now, inside the caller's transaction and
    recorded in it: its id, and whether it was created (two triggers within a
    millisecond make one)."""
    key = trigger_key(row.now)
    instance_id = f"{row.workflow_name}@{key}"
    # no source hash: the worker runs the code it has, as for a start by name
    (outcome,) = await instances_sql.instances_start(conn, [NewInstance(instance_id, row.workflow_name, "", {}, key)])
    created = outcome is StartOutcome.STARTED
    if created:  # the next tick's overlap policy sees this run
        await schedules_sql.schedule_record(conn, row.workflow_name, instance_id=instance_id)
    await _record(conn, who, "trigger", row, affected=int(created), instance_id=instance_id)
    return instance_id, created


async def _bound(conn: Executor) -> None:
    """No statement of this transaction waits for a lock longer than ``LOCK_WAIT_SECONDS``."""
    await schedules_sql.schedule_bound_transaction(conn, lock_seconds=LOCK_WAIT_SECONDS, idle_seconds=LOCK_WAIT_SECONDS)


async def _pause_or_resume(conn: Executor, args: argparse.Namespace) -> None:
    row = await _schedule(conn, args.name)
    paused = args.action == "pause"
    await set_paused(conn, row, cli_who(), paused=paused, reason=args.reason if paused else None)
    if args.json:
        emit_json({"schedule": row.workflow_name, "paused": paused})
    else:
        emit(f"{row.workflow_name}: {'paused' if paused else 'resumed'}")


async def _trigger(database: Database, args: argparse.Namespace) -> None:
    async with database.transaction() as conn:
        await _bound(conn)
        row = await _schedule(conn, args.name)
        instance_id, created = await trigger(conn, row, cli_who())
    if args.json:
        emit_json({"schedule": row.workflow_name, "instance_id": instance_id, "created": created})
    else:
        emit(instance_id)


async def _backfill(database: Database, args: argparse.Namespace) -> None:
    if args.first > args.last:
        raise UsageError(f"--from {args.first.isoformat()} is after --to {args.last.isoformat()}")
    async with database.connection() as conn:
        row = await _schedule(conn, args.name)
    ticks = ticks_between(_cron(row), args.first, args.last, MAX_BACKFILL)
    if len(ticks) > MAX_BACKFILL:
        raise UsageError(f"more than {MAX_BACKFILL} ticks from --from to --to: backfill a shorter range at a time")
    started = 0
    if not args.dry_run:
        span = {"from": args.first.isoformat(), "to": args.last.isoformat(), "ticks": len(ticks)}
        async with database.connection() as conn:  # recorded first: an interrupted backfill shows how far it got
            action_id = await _record(conn, cli_who(), "backfill", row, affected=0, **span)
        for offset in range(0, len(ticks), _BATCH):
            starts = [
                NewInstance(tick_instance_id(row.workflow_name, t), row.workflow_name, "", {}, tick_key(t))
                for t in ticks[offset : offset + _BATCH]
            ]
            async with database.transaction() as conn:  # a batch and its progress commit together
                await _bound(conn)
                outcomes = await instances_sql.instances_start(conn, starts)
                batch = sum(o is StartOutcome.STARTED for o in outcomes)
                await actions_sql.action_progress(conn, action_id, batch, {"batches": offset // _BATCH + 1})
            started += batch
    summary = {
        "schedule": row.workflow_name,
        "ticks": len(ticks),
        "started": started,
        "existing": 0 if args.dry_run else len(ticks) - started,
        "dry_run": args.dry_run,
    }
    if args.json:
        emit_json(summary)
    elif args.dry_run:
        emit(f"{row.workflow_name}: {len(ticks)} ticks from {args.first.isoformat()} to {args.last.isoformat()}")
    else:
        emit(f"{row.workflow_name}: {started} started, {summary['existing']} had run already")


async def _run(args: argparse.Namespace) -> int:
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        if args.action == "trigger":
            await _trigger(database, args)
        elif args.action == "backfill":
            await _backfill(database, args)
        elif args.action == "list":
            async with database.connection() as conn:
                await _list(conn, args)
        else:
            async with database.transaction() as conn:  # a pause and its record commit together
                await _bound(conn)
                await _pause_or_resume(conn, args)
        return 0
    except Exception as error:
        if sqlstate(error) == _LOCK_NOT_AVAILABLE:
            done = "the batches started before stay" if args.action == "backfill" else "nothing was done"
            raise KenningError(
                f"schedule {args.name!r} is held by another transaction (a session holding its row or "
                f"a tick's instance) for over {LOCK_WAIT_SECONDS:g} s: {done}; try again"
            ) from None
        raise
    finally:
        await database.dispose()


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
