"""The database clock, the only clock for leases, timers and retries (one definition).

``NOW`` is the SQL for "now": the database's transaction time, or the ``:now`` parameter
with which tests move time.
"""

from __future__ import annotations

from typing import Any

NOW = "coalesce(CAST(:now AS timestamptz), now())"


def seconds_or_none(seconds: Any) -> float | None:
    """A "seconds until the next one" column as a float, or None when there is none."""
    return None if seconds is None else float(seconds)
