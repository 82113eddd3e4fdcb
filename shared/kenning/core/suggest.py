"""``did you mean ...?``: the closest of the names an operator could have meant, for one-line
errors (the command line, ``--app`` modules, workflow names)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(value: str, candidates: Iterable[str], quote: bool = True) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or an empty string."""
    close = difflib.get_close_matches(value, list(candidates), n=1)
    if not close:
        return ""
    return f"; did you mean {close[0]!r}?" if quote else f"; did you mean {close[0]}?"
