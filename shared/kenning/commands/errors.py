"""The operator's mistakes, as the commands raise them: ``kenning`` reports one in a
single line with exit code 2 (see ``kenning.cli.explain``)."""

from __future__ import annotations

from kenning.errors import KenningError


class UsageError(KenningError):
    """What the operator asked for cannot be done as asked; the message says why and,
    where it can, what to type instead."""
