"""How long a Kenning connection may stay silent, bounded from both ends.

A worker cut off mid-transaction (packets dropped, no reset) leaves its backend "idle in
transaction", holding the rows it wrote; claims skip locked rows, so nobody takes its
instances over however long ago their leases expired. PostgreSQL's defaults bound that at
about two hours (``tcp_keepalives_idle`` 7,200 s, ``idle_in_transaction_session_timeout``
off). Kenning therefore bounds every connection's silence:

- **the client's end** (libpq's ``keepalives*`` and ``tcp_user_timeout``, every
  connection, listeners and ``ctx.session``'s included): a server or path gone silent
  fails the connection after ``silence`` seconds instead of the OS's 15 minutes or more;
- **the server's end of Kenning's own sessions** (the pool's): ``idle_in_transaction``
  ends a session whose client went quiet inside a transaction and so frees its row locks
  (the piece that works through a proxy or a pooler, where the server's TCP peer is
  alive), ``lock`` and ``statement`` bound a statement's waits, and the server's TCP
  keepalives the same ``silence``.

Sessions that run user code inside a transaction are not Kenning's alone: ``ctx.session``
(an activity may hold it open for as long as it runs) and an ``on_event`` handler's
transaction get the idle bound only from the moment Kenning's statements follow until the
commit (``SET LOCAL``, ``Database.bound_transaction``), and lose it while a handler runs
(``Database.unbound_transaction``). LISTEN connections are never in a transaction.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kenning.core.names import env_name
from kenning.errors import ConfigurationError

# The flags (``kenning.hosting.config.ProcessSettings``), whose variables ``from_environment``
# reads for a process that was given no settings (``kenning.Client``, operator commands).
IDLE_IN_TRANSACTION_FLAG = "--database-idle-in-transaction-timeout"
LOCK_FLAG = "--database-lock-timeout"
STATEMENT_FLAG = "--database-statement-timeout"
SILENCE_FLAG = "--database-silence-timeout"

# keepalive probes before a silent peer is given up: idle for half the bound, then this
# many probes over the other half
_PROBES = 3


def _milliseconds(seconds: float) -> str:
    return str(round(seconds * 1000))


def _environment_number(flag: str, default: float, expected: str = "seconds, 0 or more") -> float:
    """The number the flag's variable holds, or ``default`` when it is unset or blank."""
    variable = env_name(flag)
    raw = os.environ.get(variable)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise ConfigurationError(f"{variable}={raw!r} is invalid: expected {expected}")
    return value


@dataclass(frozen=True)
class SessionBounds:
    """Seconds; 0 leaves a bound to the server's (or the OS's) default. The defaults
    derive from the worker's default lease (30 s): a row locked by a cut-off session is
    freed within ``idle_in_transaction`` (a third of the lease) of its last statement, so
    before the lease its last heartbeat renewed expires, and the takeover bound stays a
    lease and a poll interval."""

    idle_in_transaction: float = 10.0
    lock: float = 10.0
    statement: float = 60.0
    silence: float = 20.0

    @classmethod
    def from_environment(cls) -> SessionBounds:
        default = cls()
        return cls(
            idle_in_transaction=_environment_number(IDLE_IN_TRANSACTION_FLAG, default.idle_in_transaction),
            lock=_environment_number(LOCK_FLAG, default.lock),
            statement=_environment_number(STATEMENT_FLAG, default.statement),
            silence=_environment_number(SILENCE_FLAG, default.silence),
        )

    def client_parameters(self) -> dict[str, Any]:
        """libpq's connection parameters for the client's end (they pass through a
        pooler: they are socket options, not startup parameters)."""
        if self.silence <= 0:
            return {}
        idle = max(1, round(self.silence / 2))
        interval = max(1, round(self.silence / 2 / _PROBES))
        return {
            "keepalives": 1,
            "keepalives_idle": idle,
            "keepalives_interval": interval,
            "keepalives_count": _PROBES,
            # data sent and not acknowledged for this long (a write into a dead path)
            "tcp_user_timeout": round(self.silence * 1000),
        }

    def server_tcp(self) -> dict[str, str]:
        """The server's TCP keepalives for a session straight to PostgreSQL (ignored on a
        Unix socket)."""
        if self.silence <= 0:
            return {}
        return {
            "tcp_keepalives_idle": str(max(1, round(self.silence / 2))),
            "tcp_keepalives_interval": str(max(1, round(self.silence / 2 / _PROBES))),
            "tcp_keepalives_count": str(_PROBES),
            "tcp_user_timeout": _milliseconds(self.silence),
        }

    def transaction(self) -> dict[str, str]:
        """What bounds a transaction that runs Kenning's statements only (``SET LOCAL``
        in one, session-wide on the pool's sessions); 0 is written too: a session-wide
        bound may need lifting."""
        return {
            "idle_in_transaction_session_timeout": _milliseconds(self.idle_in_transaction),
            "lock_timeout": _milliseconds(self.lock),
        }

    def own_session(self) -> dict[str, str]:
        """Everything, for a pooled session that runs Kenning's statements only."""
        return {**self.transaction(), "statement_timeout": _milliseconds(self.statement), **self.server_tcp()}


# The flags of a migration's bounds (``ProcessSettings``), read by ``from_environment``
MIGRATE_LOCK_FLAG = "--migrate-lock-timeout"
MIGRATE_RETRIES_FLAG = "--migrate-lock-retries"
MIGRATE_STATEMENT_FLAG = "--migrate-statement-timeout"


@dataclass(frozen=True)
class MigrationBounds:
    """How long a migration may wait for a table's lock (``kenning.db.migrate``).

    A DDL statement asks for a strong lock (``ACCESS EXCLUSIVE`` for most ``ALTER TABLE``,
    ``SHARE`` for ``CREATE INDEX``) and every later statement on the table queues behind
    that request while it waits: a migration stuck behind one long transaction stops all
    traffic on the table. So the wait is short (``lock`` seconds, below the pool
    sessions' 10 s, so Kenning's own statements queued behind it are not failed by their
    own bound), the whole migration rolls back and is tried again after a back-off,
    ``retries`` times, the zero-downtime practice. A statement that runs (a backfill) is
    not bounded unless ``statement`` is set; 0 leaves it to the server's default."""

    lock: float = 3.0
    retries: int = 5
    statement: float = 0.0

    @classmethod
    def from_environment(cls) -> MigrationBounds:
        default = cls()
        return cls(
            lock=_environment_number(MIGRATE_LOCK_FLAG, default.lock),
            retries=int(_environment_number(MIGRATE_RETRIES_FLAG, default.retries, "a whole number, 0 or more")),
            statement=_environment_number(MIGRATE_STATEMENT_FLAG, default.statement),
        )

    def session(self) -> dict[str, str]:
        """The migration transaction's settings (``SET LOCAL``); a bound of 0 is not set."""
        settings = {"lock_timeout": _milliseconds(self.lock)} if self.lock > 0 else {}
        if self.statement > 0:
            settings["statement_timeout"] = _milliseconds(self.statement)
        return settings

    def backoff(self, attempt: int) -> float:
        """Seconds before attempt ``attempt + 1``: 0.5, 1, 2, 4, then 8 s each."""
        return float(min(8.0, 0.5 * 2**attempt))
