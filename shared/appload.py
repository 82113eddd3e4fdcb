"""Find the user's ``App`` from ``--app module[:attribute][,module...]``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from kenning.app import App
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
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ConfigurationError(f"cannot import application module {module_name!r}: {error}") from None
        if attribute:
            candidate = getattr(module, attribute, None)
            if not isinstance(candidate, App):
                raise ConfigurationError(f"{module_name}:{attribute} is not a kenning.App")
            found = candidate
        elif found is None:
            found = next((v for v in vars(module).values() if isinstance(v, App)), None)
    return found or App()
