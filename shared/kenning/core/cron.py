"""Cron expressions for ``@workflow(schedule=...)``: parse once, then find ticks.

Five fields, ``minute hour day-of-month month day-of-week``, as in Vixie cron, or six
with a leading ``second`` field (as in Quartz and Spring). Each field takes ``*``, a
number, a range ``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n``, and comma-separated lists;
months and weekdays also take names (``JAN``, ``MON``), weekday 7 is Sunday, and ``?``
means ``*``. The macros ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``,
``@daily`` (``@midnight``) and ``@hourly`` are accepted.

When both day fields are restricted (neither starts with ``*``) a day matches if either
does, as in Vixie cron. Ticks are wall-clock times in the schedule's zone: a time that
does not exist (skipped when the clocks go forward) ticks at the moment of the change,
and a time that happens twice (when the clocks go back) ticks once, at its first
occurrence. Schedules in UTC, the default, have neither case.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name: n for n, name in enumerate(calendar.month_abbr) if name}
_WEEKDAYS = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
# A schedule that fires at all fires within 8 years (29 February, across 2100).
_SEARCH_DAYS = 8 * 366 + 2


class CronError(ValueError):
    """A cron expression or time zone that cannot be used."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DAY = _Field("day-of-month", 1, 31)
_MONTH = _Field("month", 1, 12, {k.upper(): v for k, v in _MONTHS.items()})
_WEEKDAY = _Field("day-of-week", 0, 7, _WEEKDAYS)


def _value(field: _Field, text: str) -> int:
    upper = text.upper()
    if field.names is not None and upper in field.names:
        return field.names[upper]
    if not text.isdigit():
        raise CronError(f"{field.name} field: {text!r} is not a number")
    value = int(text)
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name} field: {value} is out of range {field.low}-{field.high}")
    return value


def _parse_field(field: _Field, text: str) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{field.name} field: empty list item in {text!r}")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field.name} field: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base in ("*", "?"):
            low, high = field.low, field.high
        elif "-" in base:
            first, _, last = base.partition("-")
            low, high = _value(field, first), _value(field, last)
            if low > high:
                raise CronError(f"{field.name} field: range {base!r} runs backwards")
        else:
            low = _value(field, base)
            high = field.high if slash else low  # ``a/n`` runs from a to the end
        values.update(range(low, high + 1, step))
    if field is _WEEKDAY and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)


def _zone(name: str) -> tzinfo:
    if name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"unknown time zone {name!r} (use an IANA name such as 'Europe/Paris')") from None


@dataclass(frozen=True)
class CronSchedule:
    """A parsed cron expression in a time zone; tick times are returned in UTC."""

    expression: str
    timezone: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday
    days_restricted: bool
    weekdays_restricted: bool
    zone: tzinfo

    @classmethod
    def parse(cls, expression: str, timezone: str | None = None) -> CronSchedule:
        """Parse ``expression``; raises ``CronError`` naming the faulty field."""
        zone_name = timezone or "UTC"
        text = MACROS.get(expression.strip().lower(), expression)
        fields = text.split()
        if len(fields) == 5:
            fields.insert(0, "0")
        elif len(fields) != 6:
            raise CronError(
                f"cron expression {expression!r} has {len(fields)} fields; expected 5 "
                "(minute hour day-of-month month day-of-week) or 6 (with a leading second)"
            )
        try:
            parsed = [
                _parse_field(field, part)
                for field, part in zip((_SECOND, _MINUTE, _HOUR, _DAY, _MONTH, _WEEKDAY), fields, strict=True)
            ]
        except CronError as error:
            raise CronError(f"cron expression {expression!r}: {error}") from None
        schedule = cls(
            expression=expression,
            timezone=zone_name,
            seconds=tuple(sorted(parsed[0])),
            minutes=tuple(sorted(parsed[1])),
            hours=tuple(sorted(parsed[2])),
            days=parsed[3],
            months=parsed[4],
            weekdays=parsed[5],
            days_restricted=not fields[3].startswith(("*", "?")),
            weekdays_restricted=not fields[5].startswith(("*", "?")),
            zone=_zone(zone_name),
        )
        if schedule.days_restricted and not schedule.weekdays_restricted:
            longest = {m: 29 if m == 2 else calendar.monthrange(2001, m)[1] for m in schedule.months}
            if not any(d <= longest[m] for m in schedule.months for d in schedule.days):
                raise CronError(f"cron expression {expression!r} never fires (no such day in those months)")
        return schedule

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_days = day.day in self.days
        in_weekdays = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_days or in_weekdays
        return in_days and in_weekdays

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment`` (an aware datetime), in UTC."""
        for tick in self._ticks(moment, forward=True):
            return tick
        raise CronError(f"cron expression {self.expression!r} has no tick after {moment.isoformat()}")

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last tick at or before ``moment`` (an aware datetime), in UTC."""
        for tick in self._ticks(moment, forward=False):
            return tick
        raise CronError(f"cron expression {self.expression!r} has no tick before {moment.isoformat()}")

    # ------------------------------------------------------------------ search

    def _ticks(self, moment: datetime, *, forward: bool) -> Iterator[datetime]:
        """Ticks after (or at and before) ``moment``, nearest first."""
        if moment.tzinfo is None:
            raise ValueError("cron ticks need an aware datetime")
        moment = moment.astimezone(UTC)
        local_aware = moment.astimezone(self.zone)
        bound = local_aware.replace(tzinfo=None)
        if not forward and local_aware.fold == 1:
            # In the second pass of a repeated hour, every first-pass time up to the
            # shift later on the clock is still at or before ``moment``.
            first = local_aware.replace(fold=0).utcoffset()
            second = local_aware.utcoffset()
            if first is not None and second is not None and first > second:
                bound += first - second
        step = timedelta(days=1 if forward else -1)
        day = bound.date()
        for _ in range(_SEARCH_DAYS):
            if self.matches_day(day):
                limit = bound.time() if day == bound.date() else None
                for clock in self._times(limit, forward=forward):
                    tick = self._to_utc(datetime.combine(day, clock))
                    if tick > moment if forward else tick <= moment:
                        yield tick
            day += step

    def _times(self, bound: time | None, *, forward: bool) -> Iterator[time]:
        """Times of day in order (reversed when going back), pruned to those on the far
        side of ``bound``; the comparison in UTC has the last word."""

        def order(values: tuple[int, ...]) -> tuple[int, ...]:
            return values if forward else tuple(reversed(values))

        def before(value: int, limit: int) -> bool:
            return value < limit if forward else value > limit

        for hour in order(self.hours):
            if bound is not None and before(hour, bound.hour):
                continue
            for minute in order(self.minutes):
                if bound is not None and hour == bound.hour and before(minute, bound.minute):
                    continue
                for second in order(self.seconds):
                    if (
                        bound is not None
                        and (hour, minute) == (bound.hour, bound.minute)
                        and before(second, bound.second)
                    ):
                        continue
                    yield time(hour, minute, second)

    def _to_utc(self, local: datetime) -> datetime:
        """``local`` wall-clock time in the zone as UTC: a repeated time at its first
        occurrence, a skipped time at the moment the clocks went forward."""
        later = local.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if later.astimezone(self.zone).replace(tzinfo=None) == local:
            return later
        # In the gap: fold=1 reads it with the new offset, which lands before the change.
        low = local.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        high, offset = later, later.astimezone(self.zone).utcoffset()
        while high - low > timedelta(seconds=1):
            middle = low + (high - low) / 2
            if middle.astimezone(self.zone).utcoffset() == offset:
                high = middle
            else:
                low = middle
        return high.replace(microsecond=0)


def parse(expression: str, timezone: str | None = None) -> CronSchedule:
    """``CronSchedule.parse``: ``expression`` in ``timezone`` (an IANA name; UTC if None)."""
    return CronSchedule.parse(expression, timezone)
