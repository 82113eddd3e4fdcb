"""Published values' keys and search attributes' text, checked alike by the engine (a
``publish_value``) and the client (``Client.list(where=...)``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning.core.limits import MAX_SEARCH_VALUE_LENGTH, MAX_VALUE_KEY_LENGTH
from kenning.core.texts import check_text


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > MAX_VALUE_KEY_LENGTH:
        raise ValueError(
            f"a published value's key must be a non-empty str of at most {MAX_VALUE_KEY_LENGTH} characters"
        )
    check_text(f"key {key!r}", key)


def search_text(key: str, value: Any) -> str | None:
    """A search attribute's indexed text: a str as it is, an int or float as Python
    writes it, a bool as ``true``/``false``; None (null) is not indexed. Anything else is
    refused, before any write."""
    if value is None:
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str | int | float):
        text = str(value)
    else:
        raise TypeError(f"search attribute {key!r} takes a str, int, float or bool, not {type(value).__name__}")
    if len(text) > MAX_SEARCH_VALUE_LENGTH:
        raise ValueError(f"search attribute {key!r} is longer than {MAX_SEARCH_VALUE_LENGTH} characters")
    check_text(f"search attribute {key!r}", text)
    return text


def parse_search_pair(text: str) -> tuple[str, str]:
    """``KEY=VALUE``: a search attribute and the text it must hold, split at the first
    ``=``, the value kept as typed (commas, spaces and ``=`` included): the CLI's
    ``--where`` and the console's ``where=``, one pair each. ``ValueError`` says what is wrong."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise ValueError(f"{text!r} is not KEY=VALUE: a search attribute and its value, e.g. customer=c-1")
    check_key(key)
    search_text(key, value)
    return key, value


@dataclass(frozen=True)
class PublishedStatus:
    """What ``set_status`` published last (``Client.get_status``)."""

    text: str
    progress: float | None  # a fraction in [0, 1], or None
    updated_at: datetime | None  # when it was published (the database clock)


def status_of(value: Any, updated_at: datetime | None) -> PublishedStatus | None:
    """The status ``set_status`` stored (``{"text": ..., "progress": ...}``), None if none."""
    if not isinstance(value, dict):
        return None
    progress = value.get("progress")
    return PublishedStatus(str(value.get("text", "")), None if progress is None else float(progress), updated_at)
