"""How a connection's silence is bounded (``kenning.db.bounds``), from the settings: the
client's libpq parameters, the server's session and transaction settings, 0 as off."""

from __future__ import annotations

import pytest

from kenning.db.bounds import SessionBounds
from kenning.errors import ConfigurationError
from kenning.hosting.config import ProcessSettings


def test_the_defaults_derive_from_the_lease_and_reach_both_ends() -> None:
    bounds = ProcessSettings().database_bounds()
    assert bounds == SessionBounds(idle_in_transaction=10.0, lock=10.0, statement=60.0, silence=20.0)
    # keepalives: idle half the bound, then three probes over the other half
    assert bounds.client_parameters() == {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 3,
        "keepalives_count": 3,
        "tcp_user_timeout": 20000,
    }
    assert bounds.own_session() == {
        "idle_in_transaction_session_timeout": "10000",
        "lock_timeout": "10000",
        "statement_timeout": "60000",
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "3",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "20000",
    }
    assert bounds.transaction() == {"idle_in_transaction_session_timeout": "10000", "lock_timeout": "10000"}


def test_a_worker_frees_a_cut_off_sessions_rows_within_half_its_lease() -> None:
    from kenning_worker.worker import WorkerSettings

    assert WorkerSettings().database_bounds().idle_in_transaction == 10.0  # a third of the 30 s default
    assert WorkerSettings(lease_seconds=3.0).database_bounds().idle_in_transaction == 1.5
    off = WorkerSettings(lease_seconds=3.0, database_idle_in_transaction_timeout=0.0)
    assert off.database_bounds().idle_in_transaction == 0.0


def test_zero_turns_a_bound_off() -> None:
    off = SessionBounds(idle_in_transaction=0, lock=0, statement=0, silence=0)
    assert off.client_parameters() == {} and off.server_tcp() == {}
    assert off.own_session() == {
        "idle_in_transaction_session_timeout": "0",
        "lock_timeout": "0",
        "statement_timeout": "0",
    }


def test_a_process_given_no_settings_reads_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT", "2.5")
    monkeypatch.setenv("KENNING_DATABASE_SILENCE_TIMEOUT", "0")
    bounds = SessionBounds.from_environment()
    assert (bounds.idle_in_transaction, bounds.lock, bounds.silence) == (2.5, 10.0, 0.0)
    assert bounds.transaction()["idle_in_transaction_session_timeout"] == "2500"
    monkeypatch.setenv("KENNING_DATABASE_LOCK_TIMEOUT", "soon")
    with pytest.raises(ConfigurationError, match="KENNING_DATABASE_LOCK_TIMEOUT='soon' is invalid"):
        SessionBounds.from_environment()
