"""argparse as ``kenning`` uses it: "did you mean" for mistyped choices and flags (3.12's
``suggest_on_error`` does not exist in 3.11), and unrecognized flags reported by the
subcommand they were given to, with that subcommand's usage."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import Any

from kenning.core.suggest import did_you_mean


class ArgumentParser(argparse.ArgumentParser):
    """Subparsers are made of the class of their parent, so every level gets this."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            choices = [str(choice) for choice in action.choices]
            hint = did_you_mean(str(value), choices)
            if hint:
                shown = ", ".join(repr(choice) for choice in choices)
                raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint} (choose from {shown})")
        super()._check_value(action, value)


class VersionAction(argparse.Action):
    """``--version``: the installed package's version, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        try:
            version = importlib.metadata.version("kenning")
        except importlib.metadata.PackageNotFoundError:
            version = "(not installed)"
        sys.stdout.write(f"{parser.prog} {version}\n")
        parser.exit()


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the subcommand ``args`` chose, however deeply nested."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = None if sub is None else sub._name_parser_map.get(getattr(args, sub.dest, None) or "")
        if chosen is None:
            return parser
        parser = chosen


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; flags no parser knows are an error of the innermost subcommand."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        owner = _innermost(parser, args)
        flags = [flag for flag in owner._option_string_actions if flag.startswith("--")]
        hint = next(
            (h for e in extras if e.startswith("-") and (h := did_you_mean(e.split("=", 1)[0], flags, quote=False))),
            "",
        )
        owner.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    return args
