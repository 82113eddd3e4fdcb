"""Find the user's ``App`` from ``--app module[:attribute][,module...]``, and the settings
it provides as fallbacks (Edda's ``EddaApp(db_url, broker_url)``)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from kenning.app import App
from kenning.core.suggest import did_you_mean
from kenning.errors import ConfigurationError


def load_app(spec: str) -> App:
    """Import every module named in ``spec``; workflows register themselves on import.

    The App is the named attribute, else the first module-level ``App`` found, else a
    default ``App()``.
    """
    if not spec.strip():
        raise ConfigurationError("no application: pass --app module[:attribute] or set KENNING_APP")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    found: App | None = None
    for part in spec.split(","):
        module_name, _, attribute = part.strip().partition(":")
        if not module_name:
            raise ConfigurationError(f"--app {spec!r} names no module: module[:attribute][,module...]")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ConfigurationError(f"cannot import application module {module_name!r}: {error}") from None
        if attribute:
            found = _named_app(module_name, vars(module), attribute)
        elif found is None:
            found = next((v for v in vars(module).values() if isinstance(v, App)), None)
    _refuse_bare_agent_runs()
    return found or App()


def _refuse_bare_agent_runs() -> None:
    """An app that uses Pydantic AI gets kenning.ai's check on bare agent runs in workflow
    code even if it never imports kenning.ai: by name, as the SDK's extra is optional (and
    sits above this floor), only when the app imported Pydantic AI."""
    if "pydantic_ai" in sys.modules:
        importlib.import_module("kenning.ai.guard").refuse_bare_runs()


def _named_app(module_name: str, namespace: dict[str, object], attribute: str) -> App:
    apps = [name for name, value in namespace.items() if isinstance(value, App)]
    if attribute not in namespace:
        hint = did_you_mean(attribute, apps or [n for n in namespace if not n.startswith("_")])
        hint = hint or (f"; its kenning.App is {apps[0]!r}" if apps else "")
        raise ConfigurationError(f"{module_name} has no attribute {attribute!r}{hint}")
    value = namespace[attribute]
    if not isinstance(value, App):
        raise ConfigurationError(f"{module_name}:{attribute} is not a kenning.App (it is a {type(value).__name__})")
    return value


def database_url(configured: str, app: App | None) -> str:
    """``--database-url``/``KENNING_DATABASE_URL`` if given, else the App's ``db_url``."""
    return configured or (app.db_url if app is not None and app.db_url else "")


def broker_url(configured: str, app: App | None) -> str:
    """``--broker-url``/``KENNING_BROKER_URL`` if given, else the App's ``broker_url``."""
    return configured or (app.broker_url if app is not None and app.broker_url else "")
