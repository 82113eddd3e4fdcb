"""The instances list's Duration column: the two largest units that say it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kenning_console.instances import duration

START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("took", "shown"),
    [
        (timedelta(milliseconds=850), "850 ms"),
        (timedelta(seconds=12.34), "12.3 s"),
        (timedelta(minutes=4, seconds=2), "4 min 2 s"),
        (timedelta(hours=3, minutes=5, seconds=59), "3 h 5 min"),
        (timedelta(days=2, hours=4, minutes=1), "2 d 4 h"),
        (timedelta(seconds=-1), "0 ms"),  # clocks that disagree never show a negative time
    ],
)
def test_a_duration_in_its_two_largest_units(took: timedelta, shown: str) -> None:
    assert duration(START, START + took) == shown


def test_no_duration_until_it_ends() -> None:
    assert duration(START, None) == ""
    assert duration(None, START) == ""
