"""The database clock, the only clock for leases, timers and retries (one definition).

``NOW`` is the SQL for "now": the database's transaction time, or the ``:now`` parameter
with which tests move time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NOW = "coalesce(CAST(:now AS timestamptz), now())"


def seconds_or_none(row: Sequence[Any] | None) -> float | None:
    """The first column of a "seconds until the next one" query, or None when there is none."""
    return None if row is None or row[0] is None else float(row[0])
