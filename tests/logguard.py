"""The log guard: what the logs say is held to be true (docs/architecture.md invariant 9).

Every test runs under a guard (the autouse ``log_guard`` fixture in ``conftest.py``). It
sees the structlog output of the in-process engine, stdlib log records at error level
(asyncio's "Task exception was never retrieved", uvicorn), and the output of every
``kenning`` process the test starts (``ProcessPool`` registers each log file, other
helpers hand their captured output to ``watch_text``). When the test ends, the guard
fails it on any line that says something went wrong and that the test did not declare:

- an error-level (or critical) line;
- an event named ``*.failed`` or ``*.crashed``, whatever its level;
- a traceback, in a structured line's ``exception`` or as plain text.

A test that provokes such a line on purpose says so, before or after the fact:
``expect_log("instance.failed", workflow="saga")``. The event may be a glob
(``"outbox.*"``); each keyword must equal the line's field of that name.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import re
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_FAILURE_EVENT = re.compile(r"\.(failed|crashed)$")
_ERROR_LEVELS = frozenset({"error", "critical", "exception", "fatal"})
# stdlib logging's default formats put the level first ("ERROR:root:…", uvicorn's "ERROR:    …")
_PLAIN_ERROR = re.compile(r"^(ERROR|CRITICAL)\b")
_TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class Expected:
    """A kind of line the test provokes on purpose."""

    event: str
    fields: Mapping[str, Any]

    def matches(self, record: Mapping[str, Any]) -> bool:
        if not fnmatch.fnmatchcase(str(record.get("event", "")), self.event):
            return False
        return all(record.get(name) == value for name, value in self.fields.items())


def alarming(record: Mapping[str, Any]) -> str | None:
    """Why a structured line says something went wrong, or None."""
    level = str(record.get("level", "")).lower()
    event = str(record.get("event", ""))
    if level in _ERROR_LEVELS:
        return f"{level}-level line"
    if _FAILURE_EVENT.search(event):
        return "failure event"
    if _TRACEBACK in str(record.get("exception", "")):
        return "traceback"
    return None


@dataclass
class LogGuard:
    """The lines one test produced, and the ones it declared."""

    expected: list[Expected] = field(default_factory=list)
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    plain: list[tuple[str, str]] = field(default_factory=list)  # (source, text) of non-structured output
    files: list[tuple[str, Path]] = field(default_factory=list)
    _captures: list[list[MutableMapping[str, Any]]] = field(default_factory=list)

    def expect(self, event: str, **fields: Any) -> None:
        self.expected.append(Expected(event, fields))

    # sources ---------------------------------------------------------------------

    def processor(self, _logger: object, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
        """A structlog processor that keeps a copy of every in-process line."""
        record = dict(event_dict)
        record.setdefault("level", method_name)
        self.records.append(("in-process", record))
        for capture in self._captures:
            capture.append(record)
        return event_dict

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[MutableMapping[str, Any]]]:
        """The in-process lines logged inside the block, for assertions (what
        ``structlog.testing.capture_logs`` gives, without hiding them from the guard)."""
        lines: list[MutableMapping[str, Any]] = []
        self._captures.append(lines)
        try:
            yield lines
        finally:
            self._captures.remove(lines)

    def watch_file(self, source: str, path: Path) -> None:
        """A child process's log file, read when the test ends (after its processes stop)."""
        self.files.append((source, path))

    def watch_text(self, source: str, text: str) -> None:
        """Output captured from a process that has already ended."""
        for line in text.splitlines():
            self._take_line(source, line)

    def _take_line(self, source: str, line: str) -> None:
        stripped = line.strip()
        if not stripped:
            return
        if stripped.startswith("{"):
            try:
                parsed = json.loads(stripped)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and "event" in parsed:
                self.records.append((source, parsed))
                return
        self.plain.append((source, line))

    # the verdict -----------------------------------------------------------------

    def problems(self) -> list[str]:
        for source, path in self.files:
            if path.exists():
                self.watch_text(source, path.read_text(errors="replace"))
        self.files.clear()
        found: list[str] = []
        for source, record in self.records:
            reason = alarming(record)
            if reason and not any(expected.matches(record) for expected in self.expected):
                found.append(f"{source}: {reason}: {_brief(record)}")
        for index, (source, text) in enumerate(self.plain):
            if (_TRACEBACK in text or _PLAIN_ERROR.match(text.strip())) and not self._plain_expected(text):
                found.append(f"{source}: {text.strip()[:200]}{self._raised(index)}")
        return found

    def _raised(self, index: int) -> str:
        """For a plain traceback, its last line: the exception (the first unindented line after it)."""
        source, text = self.plain[index]
        if _TRACEBACK not in text:
            return ""
        for later_source, later in self.plain[index + 1 :]:
            if later_source == source and later[:1] not in (" ", "\t"):
                return f" … {later.strip()[:200]}"
        return ""

    def _plain_expected(self, text: str) -> bool:
        return any(fnmatch.fnmatchcase(text.strip(), f"*{expected.event}*") for expected in self.expected)


def _brief(record: Mapping[str, Any]) -> str:
    shown = {k: v for k, v in record.items() if k not in ("timestamp", "exception")}
    text = json.dumps(shown, default=str)[:400]
    exception = str(record.get("exception", ""))
    if exception:
        text += " | " + exception.strip().splitlines()[-1][:200]
    return text


class ErrorRecords(logging.Handler):
    """Stdlib log records at error level, into the guard (asyncio, uvicorn, libraries)."""

    def __init__(self, guard: LogGuard) -> None:
        super().__init__(level=logging.ERROR)
        self.guard = guard

    def emit(self, record: logging.LogRecord) -> None:
        entry: dict[str, Any] = {"event": f"{record.name}: {record.getMessage()}", "level": record.levelname.lower()}
        if record.exc_info:
            entry["exception"] = _TRACEBACK + " …"
        self.guard.records.append(("stdlib logging", entry))


_current: LogGuard | None = None


def current() -> LogGuard | None:
    """The guard of the running test (None outside one)."""
    return _current


def install(guard: LogGuard | None) -> None:
    global _current
    _current = guard


def expect_log(event: str, **fields: Any) -> None:
    """Declare a line the running test provokes on purpose (see the module's docstring)."""
    if _current is None:
        raise RuntimeError("expect_log outside a test")
    _current.expect(event, **fields)
