"""docs/configuration.md, generated from the settings declarations: every flag of every
``kenning`` command with its environment variable, default and meaning, as the command's
own parser declares them (``kenning.hosting.config``), so the reference cannot drift from the code.

``python -m kenning_devtools.configdoc > docs/configuration.md`` writes it;
``tests/unit/test_configuration_reference.py`` fails when the file is not what this prints.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator

from kenning.commands.cli import SUBCOMMANDS, build_parser
from kenning.hosting.config import declared_variables

# processes first, in the order a reader meets them; then the tools
_ORDER = ("ingress", "worker", "scheduler", "relayer", "console", "up")
_HELP = re.compile(r"^(?P<meaning>.*) \[env (?P<variable>\S+); default (?P<default>.*)\]$", re.S)

_HEADER = """# Configuration reference

Every flag of every `kenning` command has an environment variable; the flag wins over the
variable, the variable over the default. A malformed value is reported by its name with exit
code 2. A setting that means the same in every process that has it is named after its flag
(`--poll-interval` is `KENNING_POLL_INTERVAL` for the worker, the scheduler and the relayer);
one whose meaning or default differs per process carries the process's name
(`KENNING_WORKER_LEASE_SECONDS`, `KENNING_RELAYER_LEASE_SECONDS`), so one `.env` shared by
several processes sets each on purpose. The shared spellings these replaced
(`KENNING_BATCH_SIZE`, `KENNING_LEASE_SECONDS`, `KENNING_SHUTDOWN_GRACE_SECONDS`,
`KENNING_HOST`, `KENNING_PORT`, `KENNING_WORKERS`) are refused at start with one line naming
the new variable and exit code 2: a setting that silently stopped applying would be worse.
`KENNING_APP` names the modules that define workflows (`module[:attribute][,module...]`);
the `App` found there gives `db_url` (and, for the relayer, `broker_url`) as the fallback
when no URL is configured. `KENNING_ENCRYPTION_KEYS` (`id:<base64 of 32 bytes>,...`, the first
encrypts) is read by every command from the environment only, never a flag, so keys stay out
of process listings: [payload encryption](operations.md#payload-encryption). `kenning
COMMAND --help` prints the same as this page; access control (the tokens) is in
[operations](operations.md#access-control).

Generated from the settings declarations by `python -m kenning_devtools.configdoc >
docs/configuration.md`; a test keeps it current. What the settings mean in practice:
[ingress](ingress.md#configuration), [scheduler](scheduler.md#configuration),
[relayer](relayer.md#configuration), [operations](operations.md).
"""


def _subparser(command: str) -> argparse.ArgumentParser:
    parser, _ = build_parser([command])
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chosen: argparse.ArgumentParser = commands.choices[command]
    return chosen


def _rows(parser: argparse.ArgumentParser) -> Iterator[str]:
    variables = declared_variables(parser)
    for action in parser._actions:
        flag = next((o for o in action.option_strings if o in variables), None)
        if flag is None or action.help is None:
            continue
        found = _HELP.match(action.help)
        if found is None:
            raise ValueError(f"{parser.prog} {flag}: help without its variable and default: {action.help!r}")
        meaning = " ".join(found["meaning"].split()).replace("|", "\\|")
        yield f"| `{found['variable']}` / `{flag}` | `{found['default']}` | {meaning} |"


def reference() -> str:
    """The whole page, built with no ``KENNING_*`` variable set (defaults as declared)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("KENNING_")}
    for name in saved:
        del os.environ[name]
    try:
        commands = [c for c in _ORDER if c in SUBCOMMANDS] + sorted(set(SUBCOMMANDS) - set(_ORDER))
        sections = [_HEADER]
        for command in commands:
            rows = list(_rows(_subparser(command)))
            if rows:
                table = "\n".join(["| variable / flag | default | meaning |", "|---|---|---|", *rows])
                sections.append(f"## `kenning {command}`\n\n{table}\n")
        return "\n".join(sections)
    finally:
        os.environ.update(saved)


def main() -> int:
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
