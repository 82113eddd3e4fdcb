"""Text PostgreSQL can store: no NUL character (its text type has none) and no lone
surrogate (not Unicode, so the driver cannot encode it as UTF-8). Checked before a
statement, so a caller's bad value is refused naming its field, not by the driver."""

from __future__ import annotations


def text_refusal(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text`` as text, or None."""
    if "\x00" in text:
        return "contains a NUL character (PostgreSQL text cannot hold it)"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate code point (not valid Unicode text)"
    return None


def check_text(field: str, text: str) -> None:
    """``ValueError`` naming ``field`` when PostgreSQL cannot store ``text``."""
    reason = text_refusal(text)
    if reason is not None:
        raise ValueError(f"{field} {reason}")
