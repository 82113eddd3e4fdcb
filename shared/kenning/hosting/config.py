"""Settings declared once: a dataclass per process whose fields make the flags, the
``KENNING_*`` environment variables, the defaults and the ``--help`` text.

A field made with :func:`setting` is a command-line option: its flag is ``--<field name>``
(or the one given), its default is the field's, and its value may come from its
environment variable, then the default. :func:`add_settings` gives a parser every option
of a settings class, :func:`settings_from_args` builds the settings from the parsed flags;
``kenning ingress`` hands its settings to its uvicorn workers with
:func:`settings_to_environment` and :func:`settings_from_environment`. A field made with
:func:`settings_group` holds a settings class of its own (the worker's inbox loop);
a plain field is no option at all (a tuning constant tests may change).

One naming rule, in every process and in compose.yaml. A setting that means the same in
every process that has it is ``KENNING_<FLAG>``: ``--database-url`` is
``KENNING_DATABASE_URL``, ``--poll-interval`` is ``KENNING_POLL_INTERVAL``. A setting whose
meaning or default differs per process (``per_process=True``) carries the process's name,
the class's ``PROCESS``: the relayer's ``--batch-size`` is ``KENNING_RELAYER_BATCH_SIZE``,
the scheduler's is ``KENNING_SCHEDULER_BATCH_SIZE``. One ``.env`` shared by several
processes then cannot set one of them by accident: the shared spelling of such a setting
is refused at start.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import socket
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn, TypeVar

from kenning.core.names import env_name
from kenning.db import PGBOUNCER_MODES
from kenning.db.bounds import MigrationBounds, SessionBounds
from kenning.objects import payloads
from kenning.observability.logs import LEVELS

# parser -> {flag: variable}, for ``declared_variables`` (tests, docs)
_DECLARED: weakref.WeakKeyDictionary[argparse.ArgumentParser, dict[str, str]] = weakref.WeakKeyDictionary()
_SETTING = "kenning.setting"  # the metadata key of a field that is an option
_GROUP = "kenning.settings_group"  # ... of a field holding a settings class of its own
LOG_FORMATS = ("auto", "json", "console")

S = TypeVar("S")


def declared_variables(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{flag: variable}`` of every option ``add_option`` gave ``parser``."""
    return dict(_DECLARED.get(parser, {}))


def _environment_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """One line and exit code 2: the flags' usage says nothing about a variable."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def add_option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    default: Any,
    help: str,
    type: Callable[[str], Any] = str,
    choices: tuple[str, ...] | None = None,
    process: str = "",
    variable: str = "",
    repeatable: bool = False,
) -> None:
    """Add ``flag`` whose default comes from its environment variable, then ``default``.

    ``variable``: the variable's name when it is not the flag's (a repeatable flag's is
    plural). ``repeatable``: the flag may be given several times, its value a tuple of
    each one's; its variable holds them separated by whitespace, and flags given replace
    the variable's values rather than add to them.

    ``process``: the setting means something different in each process that has it (or
    has a default of its own there), so its variable carries the process's name
    (``KENNING_<PROCESS>_<FLAG>``), and the shared spelling is refused rather than
    silently read by every process that once read it.

    A malformed environment value is reported by the variable's name (exit 2, one line),
    never as a traceback.
    """
    shared = env_name(flag)
    if process and not variable and shared in os.environ:
        _environment_error(
            parser,
            f"{shared} is no longer read, as it meant different things in different processes: set "
            f"{env_name(flag, process)}",
        )
    variable = variable or env_name(flag, process)
    _DECLARED.setdefault(parser, {})[flag] = variable
    raw = os.environ.get(variable)
    value = default
    if raw is not None:
        try:
            if repeatable:
                value = tuple(type(item) for item in raw.split())
            else:
                value = parse_bool(raw) if type is bool else type(raw)
        except ValueError as error:
            _environment_error(parser, f"{variable}={raw!r} is invalid: {error}")
        if choices is not None and value not in choices:
            _environment_error(parser, f"{variable}={raw!r} is invalid: choose from {', '.join(choices)}")
    full_help = f"{help} [env {variable}; default {default!r}]"
    if type is bool:
        parser.add_argument(flag, default=value, action=argparse.BooleanOptionalAction, help=full_help)
    elif repeatable:
        parser.add_argument(flag, default=value, type=type, action=_Repeated, help=full_help)
    else:
        parser.add_argument(flag, default=value, type=type, choices=choices, help=full_help)


class _Repeated(argparse.Action):
    """A repeatable flag: a tuple of the values given, which replace the default (the
    variable's) instead of adding to it as argparse's ``append`` would."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        given = () if current is self.default or current is None else tuple(current)
        setattr(namespace, self.dest, (*given, values))


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:  # NaN too
        raise ValueError("must be greater than 0")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def port_number(text: str) -> int:
    """A TCP port, or 0 for "off" (the metrics endpoint's default)."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number from 1 to 65535, or 0 for off")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise ValueError("must not be negative")
    return value


# ------------------------------------------------------------------ declaring settings


@dataclass(frozen=True)
class Setting:
    """What makes a settings field an option (the field itself holds its default)."""

    help: str
    flag: str = ""  # default: --<field name, dashed>
    type: Callable[[str], Any] | None = None  # default: that of the field's default
    choices: tuple[str, ...] | None = None
    per_process: bool = False  # KENNING_<PROCESS>_<FLAG>, the shared spelling refused
    variable: str = ""  # default: the flag's (KENNING_<FLAG>, or per process)
    repeatable: bool = False  # a tuple of values: the flag given several times, the variable's words


def setting(
    default: Any,
    *,
    help: str,
    flag: str = "",
    type: Callable[[str], Any] | None = None,
    choices: tuple[str, ...] | None = None,
    per_process: bool = False,
    variable: str = "",
    repeatable: bool = False,
) -> Any:
    """A settings field that is an option: ``port: int = setting(8000, help=...)``."""
    declared = Setting(
        help=help,
        flag=flag,
        type=type,
        choices=choices,
        per_process=per_process,
        variable=variable,
        repeatable=repeatable,
    )
    return dataclasses.field(default=default, metadata={_SETTING: declared})


def settings_group(cls: type) -> Any:
    """A settings field holding a settings class of its own, whose options (flags as that
    class declares them) are the process's too."""
    return dataclasses.field(default_factory=cls, metadata={_GROUP: cls})


@dataclass(frozen=True)
class Option:
    """One option of a settings class, as the parser and the environment see it."""

    path: tuple[str, ...]  # field names from the top settings class down
    flag: str
    variable: str
    default: Any
    type: Callable[[str], Any]
    choices: tuple[str, ...] | None
    help: str
    process: str  # "" unless the variable carries the process's name
    repeatable: bool = False
    own_variable: bool = False  # the variable's name was given, not made from the flag

    @property
    def dest(self) -> str:
        """The ``argparse`` attribute of the flag."""
        return self.flag.lstrip("-").replace("-", "_")

    def parse(self, raw: str) -> Any:
        if self.repeatable:
            return tuple(self.type(item) for item in raw.split())
        return parse_bool(raw) if self.type is bool else self.type(raw)

    def render(self, value: Any) -> str:
        """The variable's text for ``value`` (what ``parse`` reads back)."""
        return " ".join(str(item) for item in value) if self.repeatable else str(value)

    def value(self, settings: object) -> Any:
        owner = settings
        for name in self.path:
            owner = getattr(owner, name)
        return owner


def _type_of(declared: Setting, default: Any, name: str) -> Callable[[str], Any]:
    if declared.type is not None:
        return declared.type
    if declared.repeatable:
        return str
    for kind in (bool, int, float, str):  # bool first: True is an int too
        if isinstance(default, kind):
            return kind
    raise TypeError(f"setting {name!r}: give type= (its default {default!r} does not say)")


def _fields_in_help_order(cls: type) -> list[dataclasses.Field[Any]]:
    """The class's own fields first, then those of its bases, nearest first (the options
    every service shares end ``--help``)."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    ordered: dict[str, dataclasses.Field[Any]] = {}
    for klass in cls.__mro__:
        for name in inspect.get_annotations(klass):
            if name in by_name:
                ordered.setdefault(name, by_name[name])
    return list(ordered.values())


def options(cls: type, process: str | None = None) -> Iterator[Option]:
    """Every option of settings class ``cls`` (groups included), in ``--help`` order."""
    process = getattr(cls, "PROCESS", "") if process is None else process
    for f in _fields_in_help_order(cls):
        group: type | None = f.metadata.get(_GROUP)
        if group is not None:
            for inner in options(group, process):
                yield dataclasses.replace(inner, path=(f.name, *inner.path))
            continue
        declared: Setting | None = f.metadata.get(_SETTING)
        if declared is None:
            continue
        flag = declared.flag or "--" + f.name.replace("_", "-")
        scope = process if declared.per_process else ""
        yield Option(
            path=(f.name,),
            flag=flag,
            variable=declared.variable or env_name(flag, scope),
            default=f.default,
            type=_type_of(declared, f.default, f.name),
            choices=declared.choices,
            help=declared.help,
            process=scope,
            repeatable=declared.repeatable,
            own_variable=bool(declared.variable),
        )


def add_settings(parser: argparse.ArgumentParser, cls: type) -> None:
    """Every option of ``cls`` as a flag of ``parser``, defaulting to its variable."""
    for option in options(cls):
        add_option(
            parser,
            option.flag,
            default=option.default,
            type=option.type,
            help=option.help,
            choices=option.choices,
            process=option.process,
            variable=option.variable if option.own_variable else "",
            repeatable=option.repeatable,
        )


def _build(cls: Callable[..., S], values: Mapping[tuple[str, ...], Any], prefix: tuple[str, ...] = ()) -> S:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        path = (*prefix, f.name)
        group: type | None = f.metadata.get(_GROUP)
        if group is not None:
            kwargs[f.name] = _build(group, values, path)
        elif path in values:
            kwargs[f.name] = values[path]
    return cls(**kwargs)


def settings_from_args(cls: type[S], args: argparse.Namespace) -> S:
    """The settings ``add_settings(parser, cls)`` declared, from ``parser``'s result."""
    return _applied(_build(cls, {o.path: getattr(args, o.dest) for o in options(cls)}))


def _applied(settings: S) -> S:
    """A process's settings that act process-wide take effect as they are built, so every
    process honours them alike, flag or variable: the store of large values, which the
    codec boundary (``kenning.objects.payloads``) reads wherever a payload is sealed."""
    if isinstance(settings, ProcessSettings):
        payloads.configure(settings.object_store, settings.offload_bytes)
    return settings


def settings_to_environment(settings: object) -> dict[str, str]:
    """Each option's value under its variable (what ``settings_from_environment`` reads
    back): how ``kenning ingress`` hands its settings to fresh worker processes."""
    found = ((o, o.value(settings)) for o in options(type(settings)))
    return {o.variable: o.render(value) for o, value in found if value is not None}


def settings_from_environment(cls: type[S]) -> S:
    """Settings from the options' variables; a variable not set is its default."""
    found = {o.path: o.parse(raw) for o in options(cls) if (raw := os.environ.get(o.variable)) is not None}
    return _applied(_build(cls, found))


# ------------------------------------------------------------------ what processes share


@dataclass(frozen=True, kw_only=True)
class ProcessSettings:
    """The options of every long-running process (and ``kenning migrate``)."""

    PROCESS: ClassVar[str] = ""  # the name in the variables of its per-process settings

    database_url: str = setting("", help="PostgreSQL URL (postgresql://user:pass@host/db)")
    migrate: bool = setting(True, help="bring the schema up to date at start")
    # a migration's waits for a table's lock (kenning.db.bounds.MigrationBounds)
    migrate_lock_timeout: float = setting(
        MigrationBounds.lock,
        type=non_negative_float,
        help="seconds a migration waits for a table's lock (every statement on that table queues behind it "
        "meanwhile) before it rolls back and is tried again; 0: no bound",
    )
    migrate_lock_retries: int = setting(
        MigrationBounds.retries,
        type=non_negative_int,
        help="times a migration whose lock wait ran out is tried again (after 0.5, 1, 2, 4, then 8 s) before it "
        "gives up naming the session that holds the lock",
    )
    migrate_statement_timeout: float = setting(
        MigrationBounds.statement,
        type=non_negative_float,
        help="seconds a migration's statement may run (a long backfill) before the server cancels it; 0: the "
        "server's default",
    )
    log_level: str = setting("info", choices=LEVELS, help="log level")
    log_format: str = setting("auto", choices=LOG_FORMATS, help="log format")
    pgbouncer: str = setting(
        "auto",
        choices=PGBOUNCER_MODES,
        help="the database URL leads to pgbouncer (or another pooler) in transaction mode, so no server-side "
        "prepared statements; auto: find out on the first connection",
    )
    # Each connection's silence, bounded from both ends (kenning.db.bounds); the defaults
    # derive from the worker's default lease, 30 s
    database_idle_in_transaction_timeout: float = setting(
        SessionBounds.idle_in_transaction,
        type=non_negative_float,
        help="seconds a Kenning session may sit idle inside a transaction before the server ends it and frees its "
        "row locks (a process cut off mid-transaction); a worker caps its own at half its --lease-seconds, keep the "
        "other processes' at most that (default: a third of the default 30 s lease); activities' ctx.session and "
        "on_event handlers are bounded only once their code has returned; 0: off",
    )
    database_lock_timeout: float = setting(
        SessionBounds.lock,
        type=non_negative_float,
        help="seconds a Kenning statement waits for a lock before it fails and is retried; 0: no bound",
    )
    database_statement_timeout: float = setting(
        SessionBounds.statement,
        type=non_negative_float,
        help="seconds a Kenning statement may run before the server cancels it; 0: no bound",
    )
    database_silence_timeout: float = setting(
        SessionBounds.silence,
        type=non_negative_float,
        help="seconds a database connection may go unanswered (TCP keepalives unanswered, data unacknowledged) "
        "before either end drops it; 0: the operating system's (two hours and more)",
    )
    # the fleet's registry (kenning.hosting.presence): stale after three missed heartbeats
    presence_interval: float = setting(
        10.0,
        type=positive_float,
        help="seconds between the heartbeats that keep this process in `kenning workers list`; after three missed "
        "it shows as stale",
    )
    # kenning.hosting.commitwatch: a primary that takes connections but finishes no commit
    commit_stall_seconds: float = setting(
        5.0,
        type=positive_float,
        help="seconds this process's commit probe may wait for its commit before the process is not ready "
        "(readyz 503), logs database.commits_stalled and reports kenning_commit_stall_seconds",
    )

    # large values (kenning.objects): the writers' store; a reader follows a row's reference
    object_store: str = setting(
        "",
        help="s3://bucket[/prefix] of an S3-compatible object store for values larger than --offload-bytes "
        "(credentials, region and AWS_ENDPOINT_URL as the AWS SDKs read them), for every value this process "
        "writes, flag or variable alike (Client reads the variable); empty: every value stays in its row",
    )
    offload_bytes: int = setting(
        256 * 1024,
        type=positive_int,
        help="a value whose JSON is larger than this many bytes goes to --object-store, its row keeping a reference",
    )

    def migration_bounds(self) -> MigrationBounds:
        return MigrationBounds(
            lock=self.migrate_lock_timeout, retries=self.migrate_lock_retries, statement=self.migrate_statement_timeout
        )

    def database_bounds(self) -> SessionBounds:
        return SessionBounds(
            idle_in_transaction=self.database_idle_in_transaction_timeout,
            lock=self.database_lock_timeout,
            statement=self.database_statement_timeout,
            silence=self.database_silence_timeout,
        )


@dataclass(frozen=True, kw_only=True)
class ServiceSettings(ProcessSettings):
    """The options of a process that runs a pass loop (``kenning.hosting.passloop``)."""

    poll_interval: float = setting(1.0, type=positive_float, help="fallback poll when a NOTIFY is missed (s)")
    listen: bool = setting(True, help="wake on LISTEN/NOTIFY (else poll only)")
    direct_database_url: str = setting(
        "", help="PostgreSQL itself, not a transaction-mode pooler, for LISTEN (default: --database-url)"
    )
    health_file: str = setting("", help="touched every 5 s while alive (for healthchecks)")
    # per process: several processes on one host cannot share a port (kenning.hosting.scrape)
    metrics_port: int = setting(
        0, type=port_number, per_process=True, help="serve Prometheus metrics on GET /metrics at this port; 0: off"
    )
    metrics_host: str = setting("127.0.0.1", help="address of the metrics endpoint (0.0.0.0 for every interface)")


def _add_shared(parser: argparse.ArgumentParser, *names: str) -> None:
    """Some of the shared options, for the commands that are no service (``kenning
    migrate``, ``kenning instances`` ...)."""
    for option in options(ServiceSettings):
        if option.path[0] in names:
            add_option(
                parser, option.flag, default=option.default, type=option.type, help=option.help, choices=option.choices
            )


def add_database_options(parser: argparse.ArgumentParser) -> None:
    _add_shared(parser, "database_url")


def add_migration_options(parser: argparse.ArgumentParser) -> None:
    _add_shared(parser, "migrate_lock_timeout", "migrate_lock_retries", "migrate_statement_timeout")


def add_commit_stall_option(parser: argparse.ArgumentParser) -> None:
    _add_shared(parser, "commit_stall_seconds")


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    _add_shared(parser, "log_level", "log_format")


def process_id(prefix: str = "") -> str:
    """``[prefix-]host-pid-random``: the default name of a process in leases and logs."""
    return f"{prefix}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
