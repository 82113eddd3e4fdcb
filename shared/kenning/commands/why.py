"""``kenning why ID``: why an instance is where it is, and what will move it on, in one screen.

Status and since when; the lease (holder, expiry) or the due time; what it waits for (a
timer's due time, an event's type, match and time-out) and since when; runs and attempts
with the last error; its history's length and last step; whether any process registered
its workflow (and this instance's version of it); what the stuck check recorded; when
retention will delete it. All of it read in one statement
(``kenning.storage.progress.instance_explain``), judged on the database's clock; then, from
the fleet's registry (``kenning workers list``), how many live workers run its workflow:
an instance a worker must take on is going nowhere while none does. Last, whether commits
complete at all (``kenning.storage.server.commits_waiting``): a primary whose synchronous
standby is gone answers this command's reads but holds every commit, so every unfinished
instance waits on that first.
an instance a worker must take on is going nowhere while none does. An expired lease whose
row a live transaction still locks (a worker cut off mid-transaction) names the server
backend holding it (``kenning.storage.locks``): no claim takes it over until that ends.
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import datetime, timedelta
from typing import Any

from kenning import codecs
from kenning.commands.output import emit, emit_json
from kenning.db import Database, Executor, connect
from kenning.errors import WorkflowNotFoundError
from kenning.hosting.config import add_commit_stall_option, add_database_options, add_logging_options
from kenning.storage import locks as locks_sql
from kenning.storage import processes as processes_sql
from kenning.storage import progress as progress_sql
from kenning.storage import queues as queues_sql
from kenning.storage import server as server_sql
from kenning.storage.server import CommitWaits

HELP = "explain why an instance is where it is and what will move it on"

_TERMINAL = ("completed", "failed", "cancelled")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("instance_id")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_database_options(parser)
    add_commit_stall_option(parser)
    add_logging_options(parser)


async def _explain(args: argparse.Namespace) -> dict[str, Any]:
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        return await explain(database, args.instance_id, commit_stall_seconds=args.commit_stall_seconds)
    finally:
        await database.dispose()


async def explain(database: Database, instance_id: str, *, commit_stall_seconds: float) -> dict[str, Any]:
    """What ``kenning why`` reads of one instance, with its ``way_forward`` judged (the
    command's and ``kenning mcp``'s); WorkflowNotFoundError if there is no such instance."""
    async with database.connection() as conn:
        info = await explain_on(conn, instance_id, commit_stall_seconds=commit_stall_seconds)
    if info is None:
        raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
    return info


async def explain_on(conn: Executor, instance_id: str, *, commit_stall_seconds: float) -> dict[str, Any] | None:
    """``explain`` on a connection the caller holds (the console's instance page); None:
    no such instance."""
    info = await progress_sql.instance_explain(conn, instance_id)
    if info is None:
        return None
    live, registered = await processes_sql.processes_workers_of(conn, info["workflow_name"])
    info["live_workers"], info["stale_workers"] = live, registered - live
    if info["pinned_version"] is not None:  # a pinned instance waits for its own version
        info["live_versions"] = await processes_sql.processes_versions_of(conn, info["workflow_name"])
    if info["status"] not in _TERMINAL:
        key = await queues_sql.instance_key_state(conn, instance_id)
        if key is not None:
            info["queue"] = queue_key(key)
        info["commits_stalled"] = _stalled(await server_sql.commits_waiting(conn), commit_stall_seconds)
    held = await locks_sql.expired_leases_locked(conn, limit=1, instance_id=instance_id)
    info["locked_by"] = held[0].as_json() if held else None
    info["way_forward"] = way_forward(info)
    return info


def queue_key(key: queues_sql.KeyState) -> dict[str, Any]:
    """A queued instance's key against its queue's limits, for ``kenning why``: what it
    waits for (``waits_for``: ``paused``, ``key_rate`` or ``key_slot``) and until when."""
    waits_for = "paused" if key.paused else "key_rate" if key.rate_full else "key_slot" if key.slots_full else None
    return {
        "name": key.queue_name,
        "partition_key": key.partition_key,
        "partition_strategy": key.partition_strategy,
        "partition_concurrency": key.partition_concurrency,
        "key_leased": key.key_leased,
        "key_rate_limit": key.key_rate_limit,
        "key_rate_period_seconds": key.key_rate_period_seconds,
        "key_started": key.key_started,
        "waits_for": waits_for,
        "until": key.key_frees_at if waits_for == "key_rate" else None,
    }


def _stalled(waits: CommitWaits, stall_seconds: float) -> dict[str, Any] | None:
    """The commits held for a synchronous standby, if the oldest has waited past the
    processes' ``--commit-stall-seconds``; else None."""
    if not waits.sessions or waits.oldest_seconds < stall_seconds:
        return None
    return {
        "sessions": waits.sessions,
        "oldest_seconds": round(waits.oldest_seconds, 1),
        "synchronous_standby_names": waits.standby_names,
        "sync_standbys_connected": waits.sync_standbys,
    }


def run(args: argparse.Namespace) -> int:
    info = asyncio.run(_explain(args))
    if args.json:
        emit_json(info)
    else:
        emit("\n".join(f"{label:<11}{text}" for label, text in lines(info)))
    return 0


# ------------------------------------------------------------------ judging


def _ago(now: datetime, then: datetime | str | None) -> str:
    """``2026-...Z (3m ago)`` or ``(in 3m)``, on the database's clock."""
    if then is None:
        return "-"
    moment = datetime.fromisoformat(then) if isinstance(then, str) else then
    delta = (moment - now).total_seconds()
    span = _span(abs(delta))
    return f"{moment.isoformat(timespec='seconds')} ({'in ' + span if delta > 0 else span + ' ago'})"


def _span(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def way_forward(info: dict[str, Any]) -> str:
    """What will move the instance on (docs/architecture.md invariant 7), or that nothing will."""
    if info["status"] in _TERMINAL:
        return f"none needed: {info['status']}"
    if info.get("commits_stalled"):  # whatever would move it on writes, and no write completes
        return f"NOT NOW: commits are not completing (below); then {_way_forward(info)}"
    return _way_forward(info)


def _way_forward(info: dict[str, Any]) -> str:
    status = info["status"]
    known = bool(info["definitions"])
    if not known:
        return f"none: no process ever registered workflow {info['workflow_name']!r}; start a worker with its code"
    if status in ("pending", "running", "compensating") and not _leased_now(info):
        idle = _no_live_worker(info) or _version_gone(info)
        if idle:  # what would move it on, and that nothing will until a worker runs
            return f"{_claimable(info)}; but {idle}"
    return _claimable(info) if status in ("pending", "running", "compensating") else _waiting(info)


def _claimable(info: dict[str, Any]) -> str:
    now, status, available = info["db_now"], info["status"], info["available_at"]
    if available is None:
        return "NONE: no due time and no lease (the scheduler's stuck check repairs it)"
    due = "due now" if available <= now else f"due {_ago(now, available)}"
    if info["leased"]:
        holder = info.get("locked_by")
        if available <= now and holder:
            return (
                f"lease expired {_ago(now, available)}, but {_holder(now, holder)}: no claim takes it over until "
                "that transaction ends (the server ends it after --database-idle-in-transaction-timeout idle; "
                f"an operator may end it now: SELECT pg_terminate_backend({holder['pid']}))"
            )
        if available <= now and info["runs_without_progress"]:
            # a suspect: the claim isolates it (crashloop.py), one per worker at a time
            return (
                f"lease expired {_ago(now, available)}, and {info['runs_without_progress']} earlier run(s)"
                " died without recording a step: isolated, the next worker running no other such"
                " instance takes it over (while a worker runs one, for up to a lease)"
            )
        if available <= now:
            return f"lease expired {_ago(now, available)}: the next claim of any worker takes it over"
        return f"leased by {info['lease_owner'] or '?'} until {_ago(now, available)}"
    gathering = _gathering(info)
    if gathering:
        return gathering
    what = "compensations run" if status == "compensating" else "a worker claims it"
    queue = info.get("queue") or {}
    if queue.get("waits_for") == "paused":
        return f"NOT NOW: queue {queue['name']!r} is paused (kenning queues resume {queue['name']})"
    if queue.get("waits_for") == "key_rate":
        return f"{what} when key {queue['partition_key']!r}'s rate window frees: {_ago(now, queue['until'])}"
    if queue.get("waits_for") == "key_slot":
        return f"{what} when one of key {queue['partition_key']!r}'s running instances ends"
    return f"{what}: {due}"


def _holder(now: datetime, holder: dict[str, Any]) -> str:
    state = holder["state"] or "state unknown"
    since = f" since {_ago(now, holder['since'])}" if holder["since"] else ""
    client = f", client {holder['client_address']}" if holder["client_address"] else ""
    return f"its row is still locked by server backend pid {holder['pid']} ({state}{since}{client})"


def _waiting(info: dict[str, Any]) -> str:
    now, status = info["db_now"], info["status"]
    if status == "waiting_for_timer":
        if not info["timers"]:
            return "NONE: waiting for a timer that does not exist (the stuck check repairs it)"
        timer = info["timers"][0]
        return f"timer {timer['step_id']} fires {_ago(now, timer['due_at'])}"
    if status == "waiting_for_message":
        if not info["message_waits"]:
            return "NONE: waiting for a message with no receive wait (the stuck check repairs it)"
        wait = info["message_waits"][0]
        timeout = f"; times out {_ago(now, wait['timeout_at'])}" if wait["timeout_at"] else "; no time-out"
        return f"a message on topic {wait['topic']!r} (a send wakes it){timeout}"
    if not info["subscriptions"]:
        return "NONE: waiting for an event with no subscription (the stuck check repairs it)"
    sub = info["subscriptions"][0]
    match = f" matching {sub['match']}" if sub["match"] else ""
    timeout = f"; times out {_ago(now, sub['timeout_at'])}" if sub["timeout_at"] else "; no time-out"
    return f"an event of type {sub['event_type']!r}{match}{timeout}"


def _gathering(info: dict[str, Any]) -> str:
    """What a debounced burst or an event batch still open waits for, and until when (else "")."""
    burst, now = info.get("burst"), info["db_now"]
    if not burst or info["status"] != "pending" or info["run_count"] or info["available_at"] <= now:
        return ""
    due = _ago(now, info["available_at"])
    if burst["kind"] == "batch":
        return (
            f"gathering batch of key {burst['key']!r} ({burst['folded']} of {burst['max_size']} events):"
            f" a worker claims it when full, or {due}"
        )
    return (
        f"debouncing key {burst['key']!r} ({burst['folded']} start(s) folded): a worker claims it once the key"
        f" is quiet for {burst['period_seconds']:g}s, {due}, unless another start of the key moves that on"
    )


def _burst(info: dict[str, Any]) -> str:
    burst, now = info["burst"], info["db_now"]
    if burst["kind"] == "batch":
        return (
            f"batch of key {burst['key']!r}: {burst['folded']} event(s) of at most {burst['max_size']},"
            f" first {_ago(now, burst['opened_at'])}, max wait {burst['max_wait_seconds']:g}s"
        )
    cap = f", at most {burst['max_wait_seconds']:g}s after the first" if burst["max_wait_seconds"] else ""
    return (
        f"debounced key {burst['key']!r}: {burst['folded']} start(s), first {_ago(now, burst['opened_at'])},"
        f" last {_ago(now, burst['last_at'])}; period {burst['period_seconds']:g}s{cap}"
    )


def _commits(stalled: dict[str, Any]) -> str:
    standbys = stalled["sync_standbys_connected"]
    return (
        f"commits are not completing: {stalled['sessions']} session(s) wait for a synchronous standby, the oldest "
        f"for {_span(stalled['oldest_seconds'])} (synchronous_standby_names = "
        f"{stalled['synchronous_standby_names']!r}, {standbys or 'none'} connected as synchronous); "
        "every process's /readyz fails until they complete"
    )


def _leased_now(info: dict[str, Any]) -> bool:
    return bool(info["leased"]) and info["available_at"] is not None and info["available_at"] > info["db_now"]


def _no_live_worker(info: dict[str, Any]) -> str:
    """Why nothing takes it on, when no live worker runs its workflow (else "")."""
    if info.get("live_workers", 1):
        return ""
    stale = info.get("stale_workers", 0)
    gone = f" ({stale} registered worker(s) running it are stale: stopped heartbeating)" if stale else ""
    return f"no live worker runs workflow {info['workflow_name']!r}{gone}: start a worker with its code"


def _version_gone(info: dict[str, Any]) -> str:
    """Why nothing takes on a pinned instance, when no live worker runs its version (else "")."""
    pinned, live = info["pinned_version"], info.get("live_versions")
    if pinned is None or live is None or pinned in live:
        return ""
    return (
        f"it waits for a worker running version {pinned} (it is pinned); live workers run "
        f"{_versions(live)}: start a worker of version {pinned}"
    )


def _versions(live: dict[str, int]) -> str:
    return ", ".join(f"{version} ({n})" for version, n in live.items()) or "none"


def _pinned(info: dict[str, Any]) -> str:
    text = f"pinned to code version {info['pinned_version']}"
    if info["status"] not in _TERMINAL and info.get("live_versions") is not None:
        text += f"; live workers run {_versions(info['live_versions'])}"
    return text


def _workers(info: dict[str, Any]) -> str:
    live, stale = info.get("live_workers", 0), info.get("stale_workers", 0)
    name = info["workflow_name"]
    text = f"{live} live worker(s) run {name!r}" if live else f"no live worker runs {name!r}"
    return text + (f", {stale} stale" if stale else "") + " (kenning workers list)"


def _cancel(status: str) -> str:
    """What a cancel request comes to: the future only while the instance runs on."""
    if status == "cancelled":
        return "requested: it was compensated and ended cancelled"
    if status == "failed":  # a compensation failed: the rollback stopped there
        return (
            "requested, but the rollback stopped at a failed compensation: it ended failed "
            "(kenning instances retry runs the compensations left; skip-compensation passes one)"
        )
    if status == "completed":
        return "requested too late: it ended completed"
    return "requested: it will be compensated and end cancelled"


def lines(info: dict[str, Any]) -> list[tuple[str, str]]:
    now = info["db_now"]
    out = [
        ("instance", f"{info['id']}  (workflow {info['workflow_name']})"),
        ("status", f"{info['status']}, last changed {_ago(now, info['updated_at'])}"),
        ("moves on", info["way_forward"]),
    ]
    if info.get("burst"):
        out.append(("flow", _burst(info)))
    if info["cancel_requested"]:
        out.append(("cancel", _cancel(info["status"])))
    if info["lease_owner"] or info["leased"]:
        out.append(("lease", f"{info['lease_owner'] or '?'}, expires {_ago(now, info['available_at'])}"))
    if info.get("locked_by"):
        out.append(("locked", _holder(now, info["locked_by"])))
    for timer in info["timers"]:
        out.append(("timer", f"{timer['step_id']} due {_ago(now, timer['due_at'])}, set {_ago(now, timer['since'])}"))
    for sub in info["subscriptions"]:
        match = f" matching {sub['match']}" if sub["match"] else ""
        timeout = f", times out {_ago(now, sub['timeout_at'])}" if sub["timeout_at"] else ""
        out.append(("waits for", f"{sub['event_type']!r}{match} since {_ago(now, sub['since'])}{timeout}"))
    for wait in info["message_waits"]:
        timeout = f", times out {_ago(now, wait['timeout_at'])}" if wait["timeout_at"] else ""
        out.append(
            ("receives", f"topic {wait['topic']!r} at {wait['step_id']} since {_ago(now, wait['since'])}{timeout}")
        )
    if info["unreceived_messages"]:
        out.append(("mailbox", f"{info['unreceived_messages']} message(s) not received yet"))
    runs = f"{info['run_count']} claimed"
    if info["runs_without_progress"]:
        runs += f", {info['runs_without_progress']} in a row ended without a step (crash loop count)"
    if info["claimed_at"]:
        runs += f", last {_ago(now, info['claimed_at'])}"
    out.append(("runs", runs))
    if info.get("queue"):
        out.append(("queue", queue_text(info["queue"], now)))
    for step, attempt in sorted((info["attempts"] or {}).items()):
        out.append(
            (
                "retrying",
                f"{step}: {attempt.get('attempts')} attempts since {_ago(now, attempt.get('first_failed_at'))}; "
                f"last error: {codecs.shown(attempt.get('last_error'))}",
            )
        )
    error = info["error"] or {}
    if error:
        reason = f" [{error['reason']}]" if error.get("reason") else ""
        out.append(("error", f"{error.get('type')}{reason}: {codecs.shown(error.get('message'))}"))
    last = info["last_step"]
    history = f"{info['steps']} steps"
    if last:
        history += f", last {last['kind']} {last['step_id']} {_ago(now, last['at'])}"
    if info["compensations"]:
        history += f"; {info['compensations']} compensations registered"
    out.append(("history", history))
    out.append(("workflow", _workflow(info)))
    if info["pinned_version"] is not None:
        out.append(("version", _pinned(info)))
    if info["status"] not in _TERMINAL and "live_workers" in info:
        out.append(("workers", _workers(info)))
    if info.get("commits_stalled"):
        out.append(("commits", _commits(info["commits_stalled"])))
    stuck = info["stuck_reason"]
    if stuck:
        out.append(("stuck", f"{stuck} (found {_ago(now, info['stuck_at'])})"))
    elif info["stuck_repairs"]:
        out.append(("stuck", f"repaired {info['stuck_repairs']} times, last {_ago(now, info['stuck_at'])}"))
    retention = _retention(info)
    if retention:
        out.append(("retention", retention))
    return out


def queue_text(queue: dict[str, Any], now: datetime) -> str:
    """The queue and key line: the key's slots and rate window against their limits."""
    text = f"{queue['name']}, key {queue['partition_key']!r}"
    if queue["partition_strategy"] != "wait":
        text += f" ({queue['partition_strategy']})"
    if queue["partition_concurrency"] is not None:
        text += f"; {queue['key_leased']} of {queue['partition_concurrency']} slots held"
    if queue["key_rate_limit"] is not None:
        text += (
            f"; {queue['key_started']} of {queue['key_rate_limit']} starts in the last "
            f"{_span(queue['key_rate_period_seconds'])}"
        )
        if queue["until"] is not None:
            text += f", the next {_ago(now, queue['until'])}"
    return text


def _workflow(info: dict[str, Any]) -> str:
    definitions = info["definitions"]
    if not definitions:
        return "no process ever registered it: no worker has its code"
    own = [d for d in definitions if d["source_hash"] == info["source_hash"]]
    versions = f"registered, {len(definitions)} version(s), first {_ago(info['db_now'], definitions[0]['first_seen'])}"
    if own:
        return f"{versions}; this instance's version since {_ago(info['db_now'], own[0]['first_seen'])}"
    return f"{versions}; this instance's version ({info['source_hash'][:12] or 'none'}) was never registered"


def _retention(info: dict[str, Any]) -> str:
    """When retention deletes a finished instance (its workflow's newest definition row's)."""
    if info["status"] not in _TERMINAL or info["finished_at"] is None or not info["definitions"]:
        return ""
    seconds = info["definitions"][-1]["retention_seconds"]
    if seconds is None:
        return "the scheduler's --instance-retention-days applies (0: kept)"
    return f"deleted {_ago(info['db_now'], info['finished_at'] + timedelta(seconds=seconds))}"
