"""A service starts without SQLAlchemy or Alembic: importing them cost each process about
0.4 s of CPU, most of its start, and only ``ctx.session``, event handlers' sessions and
migrations use them (``kenning.db``, ``kenning.db.migrate``). The suite starts hundreds of
processes, and operators restart them."""

from __future__ import annotations

import json
import subprocess
import sys

from kenning.core.database_urls import redacted

_IMPORTED = """
import json, sys
import kenning, kenning.commands.cli, kenning.db.errors
import kenning_worker.main, kenning_ingress.main, kenning_scheduler.main, kenning_relayer.main, kenning_console.main
import kenning.examples.orders
from kenning.db import connect
database = connect("postgresql://u:pw@127.0.0.1:1/db")
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in ("sqlalchemy", "alembic"))))
"""


def test_the_services_and_a_database_import_neither_sqlalchemy_nor_alembic() -> None:
    done = subprocess.run([sys.executable, "-c", _IMPORTED], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == []


def test_the_engine_is_built_on_first_use_with_its_sizes() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from kenning.db import connect; d = connect('postgresql://u@h/db', pool_size=3, "
            "max_overflow=2); e = d.engine; print('sqlalchemy' in sys.modules, e.pool.size(), d.engine is e)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["True", "3", "True"]


def test_a_database_url_is_logged_without_its_password_but_with_its_user() -> None:
    assert redacted("postgresql://kenning:s3cret@db:5432/app?sslmode=require") == (
        "postgresql+psycopg://kenning:***@db:5432/app?sslmode=require"
    )
    assert redacted("postgresql://kenning@db/app") == "postgresql+psycopg://kenning@db/app"
    assert redacted("postgresql://u:pw@[::1/app") == "postgresql+psycopg://***"
    assert redacted("mysql://u:pw@h/db") == "<unparsable database URL>"
