"""The package's floors (issue 26, item 1): every import inside Kenning, type-only and
late ones included, runs down the layers, never up or across them.

From the bottom: ``core`` (the vocabulary: records, names, limits; with ``kenning.errors``)
imports nothing above it; ``observability`` (logs, metrics, traces, faults) only core;
the SDK (``kenning``'s public modules) owns the interface the engine implements
(``kenning.context.Runtime``) and imports no engine, database, storage or client; the
engine implements it and imports neither storage nor the client; ``db`` (connections,
group commit) and ``storage`` (all SQL) import no SDK; the client (``kenning.client``)
sits on the SDK and storage; the code that hosts a process (``kenning.hosting``), the
operator commands and the services (``kenning_*``) on everything below, each service on
no other.
The test harness (``kenning.testing``) sits beside the commands: on everything of the
library, never on a service (its PostgreSQL mode reaches the worker and the scheduler by
name, with ``importlib``, only when it opens, as the command line reaches them through
entry points).

An arrow against the floors fails with the file, the line and the import; the few
allowed are listed in ``ALLOWED`` with their reason. A layer check that could not fail
would be worth nothing: ``test_a_planted_arrow_fails`` plants one from the SDK into storage.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support import REPO_ROOT

SHARED = REPO_ROOT / "shared"
SERVICES = ("worker", "ingress", "scheduler", "relayer", "console")

# layer -> the layers it may import (itself included)
MAY_IMPORT: dict[str, set[str]] = {
    "core": {"core"},
    "observability": {"core", "observability"},
    # payload codecs (kenning.codecs): the boundary the SDK, the engine and storage seal and unseal at
    "codecs": {"core", "codecs"},
    "sdk": {"core", "codecs", "observability", "sdk"},
    "engine": {"core", "codecs", "observability", "sdk", "engine"},
    "db": {"core", "codecs", "observability", "db"},
    "storage": {"core", "codecs", "db", "storage"},
    "client": {"core", "codecs", "observability", "sdk", "db", "storage", "client"},
    "hosting": {"core", "codecs", "observability", "sdk", "engine", "db", "storage", "client", "hosting"},
    "migrations": {"core", "codecs", "db", "storage", "migrations"},
    "commands": {
        "core",
        "codecs",
        "observability",
        "sdk",
        "engine",
        "db",
        "storage",
        "client",
        "hosting",
        "commands",
        "face",
    },
    "testing": {
        "core",
        "codecs",
        "observability",
        "sdk",
        "engine",
        "db",
        "storage",
        "client",
        "hosting",
        "face",
        "testing",
    },
    "face": {"core", "codecs", "observability", "sdk", "client", "face"},  # kenning/__init__.py, examples, kenning.ai
    # kenning.compat: other engines' APIs over the SDK, reading through the client and storage
    "compat": {"core", "codecs", "observability", "sdk", "db", "storage", "client", "compat"},
    "service": {
        "core",
        "codecs",
        "observability",
        "sdk",
        "engine",
        "db",
        "storage",
        "client",
        "hosting",
        "commands",
        "face",
    },
    "devtools": {
        *("core", "codecs", "observability", "sdk", "engine", "db", "storage", "client", "hosting", "commands", "face"),
        *("service", "devtools", "testing"),
    },
}

# (importing module, imported module): why this arrow against the floors is allowed
ALLOWED: dict[tuple[str, str], str] = {
    ("kenning.workflow", "kenning.client"): "Edda's wf.start() starts through the default client: a late import, "
    "run only when a program calls it",
    ("kenning.db.connection", "kenning.storage.server"): "the pooler probe is a statement like every other (all SQL "
    "in storage); the connection layer runs it once per pool, imported late",
}

CORE_MODULES = {"kenning.errors"}
SDK_MODULES = {
    "kenning.activity",
    "kenning.app",
    "kenning.children",
    "kenning.compensation",
    "kenning.context",
    "kenning.events",
    "kenning.flow",
    "kenning.hooks",
    "kenning.messages",
    "kenning.streams",
    "kenning.outbox",
    "kenning.queues",
    "kenning.registry",
    "kenning.retry",
    "kenning.schedules",
    "kenning.serialization",
    "kenning.starting",
    "kenning.timers",
    "kenning.workflow",
}


def layer_of(module: str) -> str | None:
    """The floor of a module of this repository (None: not Kenning's, e.g. a third party)."""
    parts = module.split(".")
    if parts[0].startswith("kenning_"):
        return "devtools" if parts[0] == "kenning_devtools" else "service"
    if parts[0] != "kenning":
        return None
    if module in CORE_MODULES:
        return "core"
    if module in SDK_MODULES:
        return "sdk"
    if module == "kenning.__main__":
        return "commands"
    if module == "kenning" or module.startswith(("kenning.examples", "kenning.ai")):
        return "face"
    if module == "kenning.client" or module.startswith("kenning.client."):
        return "client"
    sub = parts[1] if len(parts) > 1 else ""
    return {
        "core": "core",
        "observability": "observability",
        "codecs": "codecs",
        "engine": "engine",
        "db": "db",
        # the object store of large values: on the codecs' floor, whose boundary offloads
        # every payload (kenning.objects.payloads); it imports only kenning.errors
        "objects": "codecs",
        "storage": "storage",
        "hosting": "hosting",
        "migrations": "migrations",
        "commands": "commands",
        "assistant": "commands",  # kenning mcp's tools: on the operator commands' reads and actions
        "compat": "compat",
        "testing": "testing",
    }.get(sub)


@dataclass(frozen=True)
class Arrow:
    source: str  # module
    target: str  # module (or package) imported
    path: Path
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def python_files() -> Iterator[tuple[Path, Path]]:
    """(root the import name starts at, file) of every module of the packages."""
    for path in sorted((SHARED / "kenning").rglob("*.py")):
        yield SHARED, path
    for service in SERVICES:
        root = REPO_ROOT / "services" / service
        for path in sorted((root / f"kenning_{service}").rglob("*.py")):
            yield root, path
    for path in sorted((REPO_ROOT / "devtools" / "kenning_devtools").rglob("*.py")):
        yield REPO_ROOT / "devtools", path


def arrows_of(source: str, path: Path, text: str) -> Iterator[Arrow]:
    """Every import of the file, at any depth (type-only, late, in functions)."""
    package = source if path.name == "__init__.py" else source.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Arrow(source, alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from kenning.observability import metrics` imports the module kenning.observability.metrics
                yield Arrow(
                    source, f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base, path, node.lineno
                )


def _is_module(dotted: str) -> bool:
    parts = dotted.split(".")
    roots = [SHARED] + [REPO_ROOT / "services" / s for s in SERVICES] + [REPO_ROOT / "devtools"]
    for root in roots:
        base = root.joinpath(*parts)
        if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
            return True
    return False


def violations(extra: dict[str, str] | None = None) -> list[str]:
    """Arrows against the floors; ``extra``: module -> source text planted in place of the file's."""
    found = []
    for root, path in python_files():
        source = module_name(path, root)
        text = (extra or {}).get(source, path.read_text())
        for arrow in arrows_of(source, path, text):
            if arrow.target == source or arrow.target.startswith(source + "."):
                continue
            mine, theirs = layer_of(source), layer_of(arrow.target)
            if mine is None or theirs is None:
                continue
            if theirs == "service" and mine == "service":
                if arrow.target.split(".")[0] != source.split(".")[0]:
                    found.append(
                        f"{path.relative_to(REPO_ROOT)}:{arrow.line}: {source} -> {arrow.target}: another service"
                    )
                continue
            if theirs in MAY_IMPORT[mine] or (source, arrow.target) in ALLOWED:
                continue
            found.append(f"{path.relative_to(REPO_ROOT)}:{arrow.line}: {source} ({mine}) -> {arrow.target} ({theirs})")
    return found


def test_every_module_of_kenning_has_a_floor() -> None:
    unplaced = [module_name(path, root) for root, path in python_files() if layer_of(module_name(path, root)) is None]
    assert unplaced == []


def test_every_import_runs_down_the_floors() -> None:
    assert violations() == []


def test_every_allowed_exception_is_still_an_arrow_of_the_code() -> None:
    seen = {
        (arrow.source, arrow.target)
        for root, path in python_files()
        for arrow in arrows_of(module_name(path, root), path, path.read_text())
    }
    assert sorted(set(ALLOWED) - seen) == []


def test_a_planted_arrow_fails() -> None:
    planted = (SHARED / "kenning" / "events.py").read_text() + "\nfrom kenning.storage import inbox as _planted\n"
    found = violations({"kenning.events": planted})
    assert any("kenning.events (sdk) -> kenning.storage.inbox (storage)" in line for line in found), found


def test_the_top_of_the_package_is_the_sdk() -> None:
    top = sorted(p.stem for p in (SHARED / "kenning").glob("*.py"))
    # one module per concept users import; 22 since the client became a package (flow
    # control per key is one module: Debounce, Batch, RateLimit): a new concept goes into
    # a subpackage or an existing module
    assert len(top) <= 22, top
    assert {f"kenning.{name}" for name in top} - {"kenning.__init__", "kenning.__main__"} <= (
        SDK_MODULES | CORE_MODULES
    )
