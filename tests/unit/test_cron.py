"""The cron parser: fields, ticks forward and back, time zones and clock changes, errors."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from kenning import workflow
from kenning.core.cron import CronError, CronSchedule, parse
from kenning.errors import ConfigurationError
from kenning.schedules import tick_instance_id, tick_key


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def ticks(expression: str, start: datetime, n: int, timezone: str | None = None) -> list[datetime]:
    schedule = parse(expression, timezone)
    found: list[datetime] = []
    moment = start
    for _ in range(n):
        moment = schedule.next_after(moment)
        found.append(moment)
    return found


def test_fields_lists_ranges_steps_and_names() -> None:
    schedule = parse("*/15 9-17/4 1,15 JAN-mar,dec MON-FRI")
    assert schedule.seconds == (0,)
    assert schedule.minutes == (0, 15, 30, 45)
    assert schedule.hours == (9, 13, 17)
    assert schedule.days == {1, 15}
    assert schedule.months == {1, 2, 3, 12}
    assert schedule.weekdays == {1, 2, 3, 4, 5}
    assert parse("0 0 * * 7").weekdays == {0}
    assert parse("0 0 * * 5/1").weekdays == {5, 6, 0}  # a/n runs to the end of the field (7 is Sunday)
    assert parse("@hourly").minutes == (0,) and parse("@hourly").hours == tuple(range(24))
    assert parse("@daily").hours == (0,) and parse("@weekly").weekdays == {0}
    assert parse("*/20 * * * * *").seconds == (0, 20, 40)  # six fields: seconds first


def test_next_and_latest_ticks() -> None:
    assert ticks("*/15 * * * *", utc(2026, 1, 1, 10, 7), 3) == [
        utc(2026, 1, 1, 10, 15),
        utc(2026, 1, 1, 10, 30),
        utc(2026, 1, 1, 10, 45),
    ]
    schedule = parse("0 9 * * MON-FRI")
    assert schedule.next_after(utc(2026, 1, 2, 9, 0)) == utc(2026, 1, 5, 9)  # Friday 09:00 -> Monday
    assert schedule.latest_at_or_before(utc(2026, 1, 4, 12)) == utc(2026, 1, 2, 9)  # Sunday -> Friday
    assert schedule.latest_at_or_before(utc(2026, 1, 5, 9)) == utc(2026, 1, 5, 9)  # at a tick: that tick
    assert parse("*/2 * * * * *").next_after(utc(2026, 1, 1, 23, 59, 59)) == utc(2026, 1, 2)
    assert parse("@yearly").latest_at_or_before(utc(2026, 6, 1)) == utc(2026, 1, 1)


def test_both_day_fields_restricted_match_either_as_in_vixie_cron() -> None:
    # the 13th of the month OR any Friday
    assert ticks("0 0 13 * FRI", utc(2026, 2, 1), 3) == [utc(2026, 2, 6), utc(2026, 2, 13), utc(2026, 2, 20)]
    # a star in one day field: both must match (every Friday the 13th is not what * means)
    assert ticks("0 0 */1 * FRI", utc(2026, 2, 1), 1) == [utc(2026, 2, 6)]


def test_29_february_is_found_across_non_leap_years() -> None:
    assert parse("0 0 29 2 *").next_after(utc(2097, 1, 1)) == utc(2104, 2, 29)


def test_time_zone_and_clock_changes() -> None:
    paris = "Europe/Paris"
    assert ticks("30 2 * * *", utc(2026, 7, 1), 1, paris) == [utc(2026, 7, 1, 0, 30)]  # CEST, UTC+2
    assert ticks("30 2 * * *", utc(2026, 12, 1), 1, paris) == [utc(2026, 12, 1, 1, 30)]  # CET, UTC+1
    # 29 March 2026: 02:00 does not exist in Paris; the 02:30 tick runs as the clocks change
    assert ticks("30 2 * * *", utc(2026, 3, 28, 12), 2, paris) == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)]
    # 25 October 2026: 02:30 happens twice; it ticks once, at the first
    assert ticks("30 2 * * *", utc(2026, 10, 24, 12), 2, paris) == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    schedule = parse("*/30 * * * *", paris)
    in_second_pass = utc(2026, 10, 25, 1, 40)  # 02:40 CET, the repeated hour
    assert schedule.latest_at_or_before(in_second_pass) == utc(2026, 10, 25, 0, 30)
    assert schedule.next_after(in_second_pass) == utc(2026, 10, 25, 2)  # 03:00 CET


def test_tick_key_and_instance_id_are_utc() -> None:
    tick = datetime(2026, 1, 31, 11, 30, tzinfo=ZoneInfo("Europe/Paris"))  # 10:30 UTC
    assert tick_key(tick) == "2026-01-31T10:30:00Z"
    assert tick_instance_id("report", tick) == "report@2026-01-31T10:30:00Z"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * * *", "has 4 fields; expected 5"),
        ("61 * * * *", "minute field: 61 is out of range 0-59"),
        ("* 24 * * *", "hour field: 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month field: 0 is out of range 1-31"),
        ("* * * 13 *", "month field: 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week field: 8 is out of range 0-7"),
        ("*/0 * * * *", "step '0' must be a positive number"),
        ("5-1 * * * *", "range '5-1' runs backwards"),
        ("a * * * *", "minute field: 'a' is not a number"),
        ("1,,2 * * * *", "empty list item"),
        ("0 0 30 2 *", "never fires"),
    ],
)
def test_bad_expressions_are_named_clearly(expression: str, message: str) -> None:
    with pytest.raises(CronError, match=re.escape(message)):
        CronSchedule.parse(expression)


def test_bad_schedule_or_zone_on_a_workflow_is_a_configuration_error_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"workflow 'bad_cron': invalid schedule: .*minute field"):

        @workflow(schedule="99 * * * *")
        async def bad_cron(ctx: object) -> None: ...

    with pytest.raises(ConfigurationError, match="unknown time zone 'Mars/Olympus'"):

        @workflow(schedule="@daily", timezone="Mars/Olympus")
        async def bad_zone(ctx: object) -> None: ...

    with pytest.raises(ConfigurationError, match="timezone= needs schedule="):

        @workflow(timezone="UTC")
        async def no_schedule(ctx: object) -> None: ...


def test_ticks_need_an_aware_datetime() -> None:
    with pytest.raises(ValueError, match="aware"):
        parse("@hourly").next_after(datetime(2026, 1, 1))
