"""``App``'s Edda arguments are read or refused. Hooks firing: ``tests/system/test_hooks.py``."""

from __future__ import annotations

import importlib

import pytest

from kenning import App, EddaApp, RetryPolicy
from kenning.errors import ConfigurationError
from tests.apps import hooks as apps
from tests.logguard import LogGuard


def test_app_takes_eddas_arguments_in_eddas_order(log_guard: LogGuard, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.import_module("kenning.app"), "_outbox_hint_given", False)
    policy = RetryPolicy(max_attempts=2)
    with log_guard.capture() as logs:
        app = EddaApp("svc", "postgresql://u:secret@db/x", True, "http://broker/", apps.hooks, policy)
        App("again", outbox_enabled=True)
    assert EddaApp is App
    assert (app.service_name, app.db_url, app.outbox_enabled, app.broker_url) == (
        "svc",
        "postgresql://u:secret@db/x",
        True,
        "http://broker/",
    )
    assert app.hooks is apps.hooks and app.default_retry_policy is policy
    hints = [line for line in logs if line["event"] == "app.outbox_enabled"]
    assert [line["level"] for line in hints] == ["warning"]  # once per process
    assert "`kenning relayer --app <module>`" in hints[0]["hint"]
    assert App("plain").db_url is None and App("plain", "").broker_url is None


@pytest.mark.parametrize("url", ["sqlite+aiosqlite:///edda.db", "mysql://u:secret@db/x", "db.example.com/x"])
def test_an_app_db_url_kenning_cannot_use_is_refused_saying_what_to_use(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        App("svc", url)
    message = str(caught.value)
    assert message.startswith("App(db_url=...) must be a postgresql:// URL, got ")
    assert "KENNING_DATABASE_URL" in message and "secret" not in message
