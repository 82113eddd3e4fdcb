"""``kenning replay-check --app NEW_MODULE``: will the new code replay today's histories?

Every in-flight instance (and a sample of recently finished ones) of the new code's
workflows is replayed against that code (``kenning.engine.replayonly``): nothing runs,
nothing is written, the database is read in read-only transactions. Each instance gets
one line: where it would go on, or the first step where the code diverges. Exit code 1
when any instance would break, 0 when none would: a deploy pipeline's gate.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from kenning.app import App
from kenning.commands.output import emit, emit_json
from kenning.core.records import ClaimedInstance, CompensationRecord, HistoryRecord
from kenning.core.suggest import did_you_mean
from kenning.db import Database, Executor, connect
from kenning.engine.replayonly import ReplayReport, Verdict, replay_only
from kenning.errors import UsageError
from kenning.hosting.appload import database_url, load_app
from kenning.hosting.config import add_database_options, add_logging_options, add_option, positive_int
from kenning.storage import history as history_sql
from kenning.storage import replaycheck as replaycheck_sql
from kenning.storage.replaycheck import ReplayCandidate

HELP = "replay in-flight instances against new code: exit 1 if any would diverge (for CI/CD)"

# instances read per read-only transaction; their histories come in the same transaction
PAGE_SIZE = 200


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--app", default="", help="the NEW code: modules defining workflows (module[:attribute],...)")
    parser.add_argument("--workflow", help="only instances of this workflow")
    parser.add_argument(
        "--limit", type=positive_int, default=None, help="check at most this many in-flight instances (default: all)"
    )
    parser.add_argument(
        "--finished",
        type=non_negative_int,
        default=20,
        metavar="N",
        help="also replay the N most recent finished instances (default 20; 0: none)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_database_options(parser)
    add_logging_options(parser)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


Checked = tuple[ReplayCandidate, bool, ReplayReport]  # an instance, whether in flight, its verdict


async def _run(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    workflows = workflows_to_check(app, args.workflow)
    database = connect(database_url(args.database_url, app), pool_size=1, max_overflow=0)
    try:
        results = await check(
            app,
            database,
            workflows,
            limit=args.limit,
            finished=args.finished,
            each=None if args.json else lambda c, _flying, report: emit(_line(c, report)),
        )
    finally:
        await database.dispose()
    breaking = sum(1 for result in results if result[2].verdict.breaks)
    in_flight = sum(1 for result in results if result[1])
    if args.json:
        emit_json(
            {
                "checked": len(results),
                "in_flight": in_flight,
                "diverged": breaking,
                "instances": [checked_json(result) for result in results],
            }
        )
    else:
        emit(
            f"checked {len(results)} instance(s) ({in_flight} in flight, {len(results) - in_flight} finished) "
            f"of {', '.join(workflows)}: "
            + (f"{breaking} would break under the new code" if breaking else "none diverges")
        )
    return 1 if breaking else 0


async def check(
    app: App,
    database: Database,
    workflows: Sequence[str],
    *,
    limit: int | None,
    finished: int,
    each: Callable[[ReplayCandidate, bool, ReplayReport], None] | None = None,
) -> list[Checked]:
    """Replay the in-flight instances of ``workflows`` (``limit`` at most) and the
    ``finished`` most recent finished ones against ``app``; ``each`` sees each verdict
    as it comes (the command's and ``kenning mcp``'s)."""
    results: list[Checked] = []
    async for candidate, flying, history, compensations in _candidates(database, workflows, limit, finished):
        report = await replay_only(
            app, app.registry.workflows[candidate.workflow_name], _claimed(candidate), history, compensations
        )
        results.append((candidate, flying, report))
        if each is not None:
            each(candidate, flying, report)
    return results


def checked_json(result: Checked) -> dict[str, Any]:
    candidate, flying, report = result
    return {
        "instance_id": candidate.id,
        "workflow": candidate.workflow_name,
        "status": candidate.status,
        "in_flight": flying,
        **report.as_json(),
    }


def workflows_to_check(app: App, chosen: str | None) -> list[str]:
    known = sorted(app.registry.workflows)
    if chosen is None:
        if not known:
            raise UsageError("the --app modules define no workflow: nothing to check")
        return known
    if chosen not in app.registry.workflows:
        raise UsageError(
            f"the --app modules define no workflow {chosen!r}{did_you_mean(chosen, known)} "
            f"(they define: {', '.join(known) or 'none'})"
        )
    return [chosen]


async def _candidates(
    database: Database, workflows: Sequence[str], limit: int | None, finished: int
) -> AsyncIterator[tuple[ReplayCandidate, bool, list[HistoryRecord], list[CompensationRecord]]]:
    """In-flight instances page by page, then the finished sample, each with its history
    and compensations read in the same read-only transaction."""
    after, left = "", limit
    while left is None or left > 0:
        size = PAGE_SIZE if left is None else min(PAGE_SIZE, left)
        async with database.transaction() as conn:
            await replaycheck_sql.replay_transaction_read_only(conn)
            page = await replaycheck_sql.replay_in_flight_page(conn, workflows=workflows, after=after, limit=size)
            loaded = await _load(conn, page)
        for candidate in page:
            yield candidate, True, *loaded(candidate.id)
        if len(page) < size:
            break
        after = page[-1].id
        left = None if left is None else left - len(page)
    if finished:
        async with database.transaction() as conn:
            await replaycheck_sql.replay_transaction_read_only(conn)
            sample = await replaycheck_sql.replay_recent_finished(conn, workflows=workflows, limit=finished)
            loaded = await _load(conn, sample)
        for candidate in sample:
            yield candidate, False, *loaded(candidate.id)


async def _load(
    conn: Executor, page: list[ReplayCandidate]
) -> Callable[[str], tuple[list[HistoryRecord], list[CompensationRecord]]]:
    """The histories and compensations of ``page``, one statement each."""
    ids = [c.id for c in page]
    histories = await history_sql.history_load(conn, ids)
    compensations = await history_sql.compensations_load(conn, ids)
    return lambda instance_id: (histories.get(instance_id, []), compensations.get(instance_id, []))


def _claimed(candidate: ReplayCandidate) -> ClaimedInstance:
    """The instance as a run sees it; the lease token is never used (nothing is written)."""
    return ClaimedInstance(
        id=candidate.id,
        workflow_name=candidate.workflow_name,
        status=candidate.status,
        input=candidate.input,
        cancel_requested=False,
        lease_token="",
        run_count=candidate.run_count,
        attempts={},
    )


def _line(candidate: ReplayCandidate, report: ReplayReport) -> str:
    head = f"{candidate.id}  {candidate.workflow_name}  {candidate.status}"
    replayed = f"{report.replayed} step(s) replayed"
    verdict = report.verdict
    if verdict is Verdict.DIVERGED:
        instead = f"the code now runs {report.new_name!r}" if report.new_name else "the code now returns before it"
        return f"{head}  DIVERGES at step {report.step_id!r}: recorded {report.recorded_name!r}, {instead}"
    if verdict is Verdict.COMPENSATION_MISSING:
        return f"{head}  BREAKS: {report.message}"
    if verdict is Verdict.GOES_ON:
        return f"{head}  ok: {replayed}, goes on with {report.new_step}"
    if verdict is Verdict.FAILED:
        return f"{head}  ok: {replayed}, ends with its recorded failure ({report.message})"
    return f"{head}  ok: {replayed}, completes"
