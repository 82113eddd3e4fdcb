"""structlog configuration: done once in each process's entry point, and Kenning's
defaults when it is a library in someone else's program.

structlog's own defaults print every line, debug included, to stdout: a program that
prints JSON for another to read (a ``kenning.Client`` in a script) had Kenning's lines
mixed into its output. So importing ``kenning`` sets ``library_defaults`` unless the
program configured structlog first; the program configuring it later replaces them, and
Kenning's entry points replace them with ``configure_logging``.
"""

from __future__ import annotations

import logging
import sys

import structlog

LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """JSON lines when not on a terminal (or ``fmt="json"``), coloured console otherwise."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def library_defaults() -> None:
    """Unless structlog is configured: Kenning's lines go to the standard library's
    ``logging``, to loggers named as Kenning's (``kenning.client.results``...). A program that
    configured ``logging`` gets them through its handlers and levels; one that did not
    gets Python's last resort: warnings and errors on stderr, nothing below, never
    stdout. The line is its event and fields in logfmt."""
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,  # first: a line below the logger's level costs nothing more
            structlog.contextvars.merge_contextvars,
            structlog.processors.format_exc_info,
            structlog.processors.LogfmtRenderer(key_order=["event"], bool_as_flag=False),
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        # not cached: the program may configure structlog after importing kenning, and
        # Kenning's module-level loggers must follow it
        cache_logger_on_first_use=False,
    )
