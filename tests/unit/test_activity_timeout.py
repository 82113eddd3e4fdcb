"""An activity's timeout is checked where it is declared. Timeouts at work:
``tests/system/test_activity_timeout.py``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kenning import ConfigurationError, activity


def test_the_timeout_is_checked_where_it_is_declared() -> None:
    async def slow(ctx: object) -> None: ...

    assert activity(timeout=timedelta(minutes=2))(slow).timeout == 120.0
    assert activity(timeout=1)(slow).timeout == 1.0
    assert activity(slow).timeout is None
    for bad in (0, -1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ConfigurationError, match="timeout must be a positive number of seconds"):
            activity(timeout=bad)(slow)  # type: ignore[arg-type]
