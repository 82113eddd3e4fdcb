"""The one reading of a ``KEY=VALUE`` search pair (``kenning instances list --where`` and
the console's ``where=``, issue 33, item 6) and the one check of text PostgreSQL can take
(issue 33, item 5)."""

from __future__ import annotations

import pytest

from kenning.core.published import parse_search_pair
from kenning.core.texts import text_refusal


@pytest.mark.parametrize(
    ("text", "pair"),
    [
        ("customer=c-1", ("customer", "c-1")),
        ("customer=Doe, Jane", ("customer", "Doe, Jane")),  # commas and spaces kept
        ("region= eu ", ("region", " eu ")),  # as typed: not stripped
        ("formula=a=b", ("formula", "a=b")),  # split at the first =
        ("empty=", ("empty", "")),
    ],
)
def test_a_pair_is_split_at_the_first_equals_and_kept_as_typed(text: str, pair: tuple[str, str]) -> None:
    assert parse_search_pair(text) == pair


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("customer", "is not KEY=VALUE"),
        ("=c-1", "is not KEY=VALUE"),
        ("customer=a\x00b", "NUL"),
        ("customer=a\udcffb", "surrogate"),
        ("cus\x00tomer=a", "NUL"),
    ],
)
def test_a_pair_postgresql_cannot_take_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_search_pair(text)


def test_text_refusal() -> None:
    assert text_refusal("plain, with spaces and ünïcode 🎉") is None
    assert "NUL" in (text_refusal("a\x00") or "")
    assert "surrogate" in (text_refusal("\ud800") or "")
