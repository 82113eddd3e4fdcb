"""What ``kenning mcp``'s tools do, with no MCP in it: each tool is one method here,
taking plain arguments and answering a JSON-ready dict, on the reads and actions the
operator commands and the console already use (``kenning.storage``, ``commands.why``,
``commands.steering``, ``commands.schedules``, ``commands.replay_check``).

Every answer is bounded: lists by a page size, each value by the console's bounds (whole
up to 4 KiB of JSON, else a preview), the whole by ``MAX_RESULT_BYTES`` (``bounded``).

Actions are refused unless the server was started with ``--allow-actions``, and each is
recorded in the operator action log with the client's identity (``Who``). A bulk action
runs only with the ``confirm_token`` its dry run answered: the same action and filter, in
this server process, within ``DRY_RUN_TTL_SECONDS``, once.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from kenning import codecs
from kenning.app import App
from kenning.assistant import values as opening
from kenning.client.forks import ForkStepError
from kenning.commands import replay_check, steering, why
from kenning.commands import schedules as schedules_command
from kenning.commands.steering import Who
from kenning.core.published import check_key, search_text
from kenning.core.records import INSTANCE_STATUSES, InstanceRow
from kenning.db import Database, Executor
from kenning.errors import UsageError, WorkflowNotFoundError
from kenning.starting import InvalidInputError
from kenning.storage import actions as actions_sql
from kenning.storage import console as console_sql
from kenning.storage import console_values as console_values_sql
from kenning.storage import instances as instances_sql
from kenning.storage import processes as processes_sql
from kenning.storage import published as published_sql
from kenning.storage import queues as queues_sql
from kenning.storage import schedules as schedules_sql
from kenning.storage import streams as streams_sql

MAX_PAGE = 100  # rows one answer lists at most, whatever the limit asked
MAX_RESULT_BYTES = 64_000  # an answer's JSON text at most: an assistant's context is not a dump
DRY_RUN_TTL_SECONDS = 600.0
_BOUNDS = console_sql.Bounds(bound=4096, preview=1024)
_READ_ONLY = "refused: kenning mcp runs read-only; an operator starts it with --allow-actions to allow actions"
BULK_ACTIONS = tuple(steering.BULK_STATUSES)


def moment(text: str | None, name: str) -> datetime | None:
    """An ISO 8601 time argument (UTC when it names no zone), or None."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{name}: {text!r} is not a time: use 2026-01-31T14:00:00Z (ISO 8601)") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _status(status: str | None) -> str:
    if status and status not in INSTANCE_STATUSES:
        raise UsageError(f"status: {status!r} is not a status: one of {', '.join(INSTANCE_STATUSES)}")
    return status or ""


def _where(where: dict[str, Any]) -> dict[str, str]:
    """Search attributes as the search indexes them: 3 as "3", true as "true"."""
    texts: dict[str, str] = {}
    for key, value in where.items():
        try:
            check_key(key)
            text = search_text(key, value)
        except (TypeError, ValueError) as error:
            raise UsageError(f"where: {error}") from None
        if text is None:
            raise UsageError(f"where: {key!r} is null: a search attribute's null is not indexed")
        texts[key] = text
    return texts


def _cursor(text: str | None) -> console_sql.Cursor | None:
    """The ``next_cursor`` a page answered: ``<created_at ISO>|<id>``."""
    if not text:
        return None
    created, bar, instance_id = text.partition("|")
    at = None
    try:
        at = datetime.fromisoformat(created)
    except ValueError:
        pass
    if not bar or at is None or not instance_id:
        raise UsageError(f"cursor: {text!r} is not a cursor this tool answered (next_cursor)")
    return console_sql.Cursor(at, instance_id)


def _error_message(instance: dict[str, Any]) -> None:
    """The start of an error's message, read in SQL from the stored error: a sealed
    message's text is its envelope's, so it is taken from the opened error instead."""
    message = instance.get("error_message")
    if not isinstance(message, str) or opening.envelope_at(message) != 0:
        return
    error = instance.get("error")
    opened = error.get("message") if isinstance(error, dict) else codecs.ENCRYPTED
    instance["error_message"] = (opened if isinstance(opened, str) else json.dumps(opened))[: _BOUNDS.preview]


def _row(row: Any) -> dict[str, Any]:
    """A bounded row: its columns, without the previews of values shown whole."""
    found: dict[str, Any] = row._asdict()
    return {k: v for k, v in found.items() if not (k.endswith("_preview") and v is None)}


def bounded(result: dict[str, Any], limit: int = MAX_RESULT_BYTES) -> str:
    """``result`` as JSON text of at most ``limit`` bytes: its longest list halved until
    it fits, and a ``truncated`` note saying so and how to ask for the rest."""
    text = json.dumps(result, default=str, ensure_ascii=False)
    cut: dict[str, int] = {}
    while len(text.encode()) > limit:
        lists = {k: v for k, v in result.items() if isinstance(v, list) and v}
        if not lists:  # one value too long even alone: its text's start
            note = f"the answer was {len(text.encode())} bytes, over {limit}: its first characters only"
            return json.dumps({"truncated": note, "text": text[: limit // 2]}, ensure_ascii=False)
        key = max(lists, key=lambda k: len(json.dumps(lists[k], default=str)))
        cut.setdefault(key, len(lists[key]))
        result = {**result, key: lists[key][: len(lists[key]) // 2]}
        kept = ", ".join(f"{len(result[k])} of {total} {k}" for k, total in cut.items())
        result["truncated"] = (
            f"cut to {limit} bytes: {kept} shown; ask for fewer (limit) or page on (offset, cursor, history_after)"
        )
        text = json.dumps(result, default=str, ensure_ascii=False)
    return text


@dataclass(frozen=True)
class _DryRun:
    action: str
    shown: dict[str, Any]
    until: float


@dataclass
class Operations:
    """The tools' work, on one database; ``app`` for replay_check (None: not offered)."""

    database: Database
    allow_actions: bool = False
    app: App | None = None
    commit_stall_seconds: float = 5.0
    _dry_runs: dict[str, _DryRun] = field(default_factory=dict)

    # ---------------------------------------------------------------- reads

    async def search_instances(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        where: dict[str, Any] | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        limit: int = 20,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Newest first, by the console's keyset pages: ``next_cursor`` asks for the next."""
        filters = console_sql.InstanceFilters(
            status=_status(status),
            workflow=workflow or "",
            since=moment(created_after, "created_after"),
            until=moment(created_before, "created_before"),
            where=json.dumps(_where(where)) if where else "",
        )
        async with self.database.connection() as conn:
            page = await console_sql.instances_page(
                conn, filters, after=_cursor(cursor), limit=min(limit, MAX_PAGE), scan_limit=MAX_PAGE
            )
        following = None if page.next is None else f"{page.next.created_at.isoformat()}|{page.next.id}"
        return {"instances": [_row(r) for r in page.rows], "next_cursor": following}

    async def show_instance(
        self, instance_id: str, *, history_after: int = 0, history_limit: int = 50
    ) -> dict[str, Any]:
        """One instance: its facts and values bounded, a page of its history, what it waits
        for, its published values, streams and compensations, and ``why``: what will move
        it on."""
        limit = min(history_limit, MAX_PAGE)
        async with self.database.connection() as conn:
            row = await console_sql.instance(conn, instance_id, _BOUNDS)
            if row is None:
                raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
            history = await console_sql.instance_history_page(
                conn, instance_id, after=history_after, limit=limit + 1, bounds=_BOUNDS
            )
            waits = await console_sql.instance_waits(conn, instance_id, limit=MAX_PAGE, bounds=_BOUNDS)
            timers = await console_sql.instance_timers(conn, instance_id, limit=MAX_PAGE)
            values = await published_sql.values_shown(
                conn, instance_id, limit=MAX_PAGE, bound=_BOUNDS.bound, preview=_BOUNDS.preview
            )
            streams = await streams_sql.streams_of(conn, instance_id, limit=MAX_PAGE)
            compensations = await console_sql.instance_compensations(
                conn, instance_id, console_sql.Window(None, None, MAX_PAGE), _BOUNDS
            )
        explained = await why.explain(self.database, instance_id, commit_stall_seconds=self.commit_stall_seconds)
        more = len(history) > limit
        history = history[:limit]
        shown_values = [asdict(v) for v in values]
        shown_history = [_row(h) for h in history]
        compensations_shown = [_row(c) for c in compensations]
        instance_shown = _row(row)
        # sealed values opened (or "encrypted"), offloaded ones previewed (kenning.assistant.values)
        for name in ("input", "result", "error"):
            await self._open(instance_shown, name, instance_id, name, "")
        _error_message(instance_shown)
        for record in shown_history:
            await self._open(record, "payload", instance_id, "step", record["seq"])
            await opening.bounded_column(record, "payload_rest", _BOUNDS, None)
        for compensation in compensations_shown:
            for name in ("args", "kwargs"):
                await self._open(compensation, name, instance_id, name, compensation["comp_id"])
        for value in shown_values:
            await self._open(value, "value", instance_id, "value", value["key"], size_name="size")
        return {
            "instance": instance_shown,
            "why": {
                "way_forward": explained["way_forward"],
                "lines": [f"{label}: {text}" for label, text in why.lines(explained)],
            },
            "waits": {"events": [_row(w) for w in waits], "timers": [_row(t) for t in timers]},
            "published_values": shown_values,
            "streams": [asdict(s) for s in streams],
            # a saga's undo steps, in the order registered (they run in reverse); ran_kind if ran
            "compensations": compensations_shown,
            "history": shown_history,
            "history_next": history[-1].seq if more else None,
        }

    async def _open(
        self, row: dict[str, Any], name: str, instance_id: str, of: str, key: object, size_name: str | None = None
    ) -> None:
        async def whole() -> Any:
            """The value's stored JSON whole (a sealed one opens only whole; opening.OPEN_LIMIT)."""
            parts: list[bytes] = []
            async with self.database.connection() as conn:
                async for _total, chunk in console_values_sql.value_chunks(
                    conn, of, instance_id, str(key), chunk=opening.OPEN_LIMIT
                ):
                    parts.append(chunk)
            return json.loads(b"".join(parts)) if parts else None

        await opening.bounded_column(row, name, _BOUNDS, whole, size_name)

    async def list_workers(self, *, kind: str | None = None, live_only: bool = False) -> dict[str, Any]:
        if kind and kind not in processes_sql.KINDS:
            raise UsageError(f"kind: {kind!r} is not a kind of process: one of {', '.join(processes_sql.KINDS)}")
        async with self.database.connection() as conn:
            entries = await processes_sql.processes_list(conn, kind=kind or None)
        shown = [{**asdict(e), "state": "live" if e.live else "stale"} for e in entries if e.live or not live_only]
        return {"processes": shown[:MAX_PAGE], "total": len(shown)}

    async def list_queues(self) -> dict[str, Any]:
        async with self.database.connection() as conn:
            queues = await queues_sql.queues_overview(conn)
        return {"queues": [asdict(q) for q in queues[:MAX_PAGE]], "total": len(queues)}

    async def list_schedules(self) -> dict[str, Any]:
        async with self.database.connection() as conn:
            rows = await schedules_sql.schedules_list(conn)
        return {"schedules": [schedules_command.schedule_view(r) for r in rows[:MAX_PAGE]], "total": len(rows)}

    async def list_actions(
        self, *, target: str | None = None, kind: str | None = None, limit: int = 20, before: int | None = None
    ) -> dict[str, Any]:
        """The operator action log, newest first; ``before``: the ``next_before`` answered."""
        page = min(limit, MAX_PAGE)
        async with self.database.connection() as conn:
            rows = await actions_sql.actions_list(
                conn, target=target or None, action=kind or None, before=before, limit=page
            )
        return {"actions": [asdict(r) for r in rows], "next_before": rows[-1].id if len(rows) == page else None}

    async def replay_check(self, *, workflow: str | None = None, limit: int = 50, finished: int = 20) -> dict[str, Any]:
        """``kenning replay-check`` against the server's ``--app``: the verdicts, those
        that would break first."""
        if self.app is None:
            raise UsageError("replay_check needs the new code: start kenning mcp with --app MODULE")
        workflows = replay_check.workflows_to_check(self.app, workflow)
        results = await replay_check.check(
            self.app, self.database, workflows, limit=min(limit, 1000), finished=min(finished, MAX_PAGE)
        )
        # those that would break first
        checked = [replay_check.checked_json(r) for r in sorted(results, key=lambda r: not r[2].verdict.breaks)]
        return {
            "checked": len(results),
            "in_flight": sum(1 for r in results if r[1]),
            "diverged": sum(1 for r in results if r[2].verdict.breaks),
            "instances": checked,
        }

    # ---------------------------------------------------------------- actions

    def _allowed(self) -> None:
        if not self.allow_actions:
            raise UsageError(_READ_ONLY)

    async def _instance(self, conn: Executor, instance_id: str) -> InstanceRow:
        row = await instances_sql.instance_get(conn, instance_id)
        if row is None:
            raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
        return row

    async def act(
        self, action: str, instance_id: str, who: Who, *, reason: str | None = None, compensation: str | None = None
    ) -> dict[str, Any]:
        """cancel, retry, terminate or skip-compensation on one instance, recorded with ``who``."""
        self._allowed()
        if action in ("terminate", "skip-compensation") and not (reason or "").strip():
            raise UsageError(f"reason: {action} needs a reason (it is recorded in the action log)")
        async with self.database.transaction() as conn:  # the action and its record commit together
            row = await self._instance(conn, instance_id)
            if action == "cancel":
                outcome = await steering.cancel(conn, row, who)
            elif action == "retry":
                outcome = await steering.retry(conn, row, who)
            elif action == "terminate":
                outcome = await steering.terminate(conn, row, who, str(reason))
            else:
                outcome = await steering.skip_compensation(conn, row, who, str(reason), compensation or None)
        return {"instance_id": instance_id, "action": action, "done": outcome.done, "message": outcome.message}

    async def fork(
        self, instance_id: str, from_step: str, who: Who, *, arguments: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """``kenning instances fork``: a new instance with this one's history before
        ``from_step`` (a number or a step id), running today's code from it; recorded."""
        self._allowed()
        async with self.database.transaction() as conn:  # the fork and its record commit together
            row = await self._instance(conn, instance_id)
            try:
                forked = await steering.fork(conn, row, who, from_step, arguments)
            except (ForkStepError, InvalidInputError) as error:
                raise UsageError(f"cannot fork {instance_id}: {error}") from None
        return {**asdict(forked), "instance_id": instance_id, "message": forked.said()}

    async def bulk(
        self,
        action: str,
        who: Who,
        *,
        statuses: list[str] | None = None,
        workflow: str | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        reason: str | None = None,
        dry_run: bool = True,
        confirm_token: str | None = None,
    ) -> dict[str, Any]:
        """A bulk action by filter: a dry run counts and answers a ``confirm_token``; the
        real run needs it (same action, same filter)."""
        self._allowed()
        if action not in BULK_ACTIONS:
            raise UsageError(f"action: {action!r} is not a bulk action: one of {', '.join(BULK_ACTIONS)}")
        if action == "terminate" and not (reason or "").strip():
            raise UsageError("reason: terminate needs a reason (it is recorded in the action log)")
        for status in statuses or []:
            _status(status)
        selected = steering.bulk_filter(
            action,
            statuses,
            workflow=workflow,
            created_before=moment(created_before, "created_before"),
            created_after=moment(created_after, "created_after"),
        )
        shown = json.loads(json.dumps(selected.shown(), default=str))
        if not dry_run:
            self._confirmed(action, shown, confirm_token)
        result = await steering.bulk(self.database, action, selected, who, reason=reason, dry_run=dry_run)
        answer: dict[str, Any] = {"action": action, "dry_run": dry_run, "filter": shown, **asdict(result)}
        if dry_run:
            self._forget_expired()
            token = secrets.token_urlsafe(12)
            self._dry_runs[token] = _DryRun(action, shown, time.monotonic() + DRY_RUN_TTL_SECONDS)
            answer["confirm_token"] = token
            answer["next"] = (
                f"{result.matched} instance(s) match; to {action} them, call bulk_action again with the same "
                f"action and filter, dry_run false and this confirm_token (valid {DRY_RUN_TTL_SECONDS:.0f} s, once)"
            )
        return answer

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for token in [t for t, run in self._dry_runs.items() if run.until < now]:
            del self._dry_runs[token]

    def _confirmed(self, action: str, shown: dict[str, Any], token: str | None) -> None:
        """The real run's dry run: made here, for the same action and filter, not expired; used up."""
        self._forget_expired()
        if not token:
            raise UsageError(
                "confirm_token: a bulk action runs only after its dry run: call it with dry_run true first"
            )
        run = self._dry_runs.get(token)
        if run is None:
            raise UsageError("confirm_token: unknown or expired: make the dry run again")
        if run.action != action or run.shown != shown:
            raise UsageError("confirm_token: its dry run was of another action or filter: make the dry run again")
        del self._dry_runs[token]

    async def schedule(self, action: str, name: str, who: Who, *, reason: str | None = None) -> dict[str, Any]:
        """pause, resume or trigger one schedule, as ``kenning schedules`` does, recorded."""
        self._allowed()
        async with self.database.transaction() as conn:
            await schedules_sql.schedule_bound_transaction(
                conn,
                lock_seconds=schedules_command.LOCK_WAIT_SECONDS,
                idle_seconds=schedules_command.LOCK_WAIT_SECONDS,
            )
            row = await schedules_sql.schedule_get(conn, name)
            if row is None:
                raise UsageError(f"no schedule {name!r}: list_schedules shows the schedules there are")
            if action == "trigger":
                instance_id, created = await schedules_command.trigger(conn, row, who)
                return {"schedule": name, "instance_id": instance_id, "created": created}
            paused = action == "pause"
            await schedules_command.set_paused(conn, row, who, paused=paused, reason=reason if paused else None)
        return {"schedule": name, "paused": paused}
