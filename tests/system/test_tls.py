"""Kenning on a PostgreSQL that requires TLS, checked the strict way
(``sslmode=verify-full``: the server's certificate chains to the CA the user names and
is for the host the URL names), as a managed database is reached. The test makes its own
CA and server certificate with the openssl command."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from kenning import Client
from kenning.db import connect
from tests.pg_clusters import Cluster, owned_directory, require_postgres_bin, run_as
from tests.support import ProcessPool, kenning_command, workers_started

APP = "tests.apps.core"
OPENSSL = shutil.which("openssl")

pytestmark = pytest.mark.skipif(OPENSSL is None, reason="the openssl command is not installed")


def _openssl(*args: str | Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *map(str, args)], check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA: its certificate and its key."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", key, "-out", cert)  # fmt: skip
    return cert, key


def make_server_certificate(directory: Path, ca: tuple[Path, Path], names: str) -> tuple[Path, Path]:
    """A server certificate signed by ``ca`` for ``names`` (subjectAltName, e.g. ``DNS:localhost,IP:127.0.0.1``)."""
    cert, key, request = directory / "server.crt", directory / "server.key", directory / "server.csr"
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kenning-test-server", "-keyout", key, "-out", request
    )
    extensions = directory / "server.ext"
    extensions.write_text(f"subjectAltName = {names}\n")
    _openssl("x509", "-req", "-in", request, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-days", "2",
             "-extfile", extensions, "-out", cert)  # fmt: skip
    user = run_as()
    if user is not None:  # PostgreSQL reads its key only when it owns it, mode 0600
        entry = pwd.getpwnam(user)
        os.chown(key, entry.pw_uid, entry.pw_gid)
    key.chmod(0o600)
    return cert, key


class TlsServer:
    def __init__(self, cluster: Cluster, ca: Path, other_ca: Path) -> None:
        self.cluster = cluster
        self.ca = ca
        self.other_ca = other_ca

    def url(self, host: str, root: Path) -> str:
        return f"postgresql://postgres@{host}:{self.cluster.port}/kenning?sslmode=verify-full&sslrootcert={root}"


@pytest.fixture
def tls_server() -> Iterator[TlsServer]:
    binaries = require_postgres_bin()
    with owned_directory("kenning-tls-") as root:
        ca = make_ca(root, "test-ca")
        other_ca = make_ca(root, "other-ca")
        cert, key = make_server_certificate(root, ca, "DNS:localhost,IP:127.0.0.1")
        cluster = Cluster(binaries, root, "tls").initdb(
            "ssl = on", f"ssl_cert_file = '{cert}'", f"ssl_key_file = '{key}'"
        )
        # TLS or nothing, as a managed database answers
        (cluster.data / "pg_hba.conf").write_text(
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n"
        )
        try:
            cluster.start()
            with psycopg.connect(cluster.url() + "?sslmode=require", autocommit=True) as admin:
                admin.execute("CREATE DATABASE kenning")
            yield TlsServer(cluster, ca[0], other_ca[0])
        finally:
            cluster.kill()


async def test_kenning_runs_on_a_server_checked_with_verify_full(tls_server: TlsServer, processes: ProcessPool) -> None:
    url = tls_server.url("localhost", tls_server.ca)
    migrated = kenning_command("migrate", url=url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    worker = processes.spawn(
        ["worker", "--app", APP, "--no-migrate", "--poll-interval", "0.2"], {"KENNING_DATABASE_URL": url}, "worker"
    )
    await workers_started(processes, [worker])
    database = connect(tls_server.url("127.0.0.1", tls_server.ca))  # the IP is in the certificate too
    try:
        async with Client(database=database) as client:
            started = await client.start("three_steps", value=4)
            assert await client.result(started.instance_id, timeout=30) == (4 + 1) * 2 - 3
    finally:
        await database.dispose()
    with psycopg.connect(url, autocommit=True) as sql:
        encrypted = sql.execute(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
            " WHERE a.datname = 'kenning' AND a.backend_type = 'client backend'"
        ).fetchone()
    assert encrypted == (True,)


def test_a_certificate_from_another_ca_is_refused_with_a_clear_error(tls_server: TlsServer) -> None:
    refused = kenning_command("migrate", url=tls_server.url("localhost", tls_server.other_ca))
    assert refused.returncode != 0
    assert "certificate verify failed" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
