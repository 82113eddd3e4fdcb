"""The NOTIFY expressions statements embed: ``notify(CHANNEL_INSTANCES)`` and the result
notifications a client listens for. The names themselves (channels, history kinds) are
``kenning.core.names``: the engine and the processes read them without importing SQL."""

from __future__ import annotations

from kenning.core.names import CHANNEL_RESULTS, RESULTS_LISTENERS_LOCK, RESULTS_LISTENERS_LOCKS


def notify(channel: str) -> str:
    """The SQL expression that notifies ``channel``: ``pg_notify`` returns void, so
    ``IS NULL`` makes it a boolean column (``... AS notified``)."""
    return f"pg_notify('{channel}', '') IS NULL"


# A finished instance's id goes into CHANNEL_RESULTS's payload (a JSON array) if its JSON
# form is at most this long; a longer one is sent as null, which wakes every waiter of
# the client (it reads its own instance's row). Payloads are filled up to
# _RESULTS_PAYLOAD_FILL bytes, so with one more id at most they stay under NOTIFY's 8,000.
_RESULTS_ID_BYTES = 1000
_RESULTS_PAYLOAD_FILL = 6800


def _results_payload_id(id_column: str) -> str:
    return f"CASE WHEN octet_length(CAST(to_json({id_column}) AS text)) <= {_RESULTS_ID_BYTES} THEN {id_column} END"


def notify_results(finished: str) -> str:
    """A scalar subquery notifying CHANNEL_RESULTS of the instances in ``finished`` (a CTE
    of the statement with an ``id`` column: the instances it ended), if any client
    listens (RESULTS_LISTENERS_LOCK): one notification per statement, more only when the
    ids need more than one payload. True if any was sent, NULL if none was. The
    statement's main query must read this column: a CTE that only selects runs only if
    it is read."""
    lock = f"{RESULTS_LISTENERS_LOCK} + pg_backend_pid() % {RESULTS_LISTENERS_LOCKS}"
    return f"""(CASE WHEN pg_try_advisory_xact_lock({lock}) THEN NULL ELSE (
        SELECT bool_and(n.sent) FROM (
            SELECT pg_notify('{CHANNEL_RESULTS}', CAST(json_agg(c.id ORDER BY c.id) AS text)) IS NOT NULL AS sent
            FROM (SELECT {_results_payload_id("f.id")} AS id,
                         sum(least(octet_length(CAST(to_json(f.id) AS text)), {_RESULTS_ID_BYTES}) + 2)
                             OVER (ORDER BY f.id) / {_RESULTS_PAYLOAD_FILL} AS chunk
                  FROM {finished} AS f) AS c
            GROUP BY c.chunk) AS n) END)"""


def notify_result(id_column: str) -> str:
    """The SQL expression notifying CHANNEL_RESULTS that the one instance ``id_column``
    finished (a boolean, true), for a statement that ends instances one row at a time
    and rarely (the claim parking a crash loop). (A void is not NULL: ``IS NOT NULL``
    makes the call a true.)"""
    return (
        f"pg_notify('{CHANNEL_RESULTS}', CAST(json_build_array({_results_payload_id(id_column)}) AS text)) IS NOT NULL"
    )
