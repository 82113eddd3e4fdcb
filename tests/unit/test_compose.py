"""compose.yaml and the Dockerfile: valid, complete, and unable to drift from the CLI. The
wheel the image installs: ``tests/system/test_compose.py``."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import tomllib
from typing import Any

import jsonschema
import pytest
import yaml

from kenning.commands.cli import SUBCOMMANDS, build_parser
from kenning.hosting.config import declared_variables
from tests.support import REPO_ROOT

SCHEMA = json.loads((REPO_ROOT / "tests" / "schemas" / "compose-spec.json").read_text())


COMPOSE: dict[str, Any] = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())


SERVICES: dict[str, Any] = COMPOSE["services"]


KENNING_SERVICES = ("ingress", "worker", "scheduler", "relayer", "console")


def resolve(value: str) -> str:
    """``${VAR:-default}`` as compose would expand it with VAR unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    # the spec's $schema is draft-07's URL spelled without "#", which jsonschema does not
    # recognise by name: pick the validator explicitly rather than let it guess
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    errors = sorted(jsonschema.Draft7Validator(SCHEMA).iter_errors(COMPOSE), key=str)
    assert errors == [], "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    broken = {**COMPOSE, "services": {**SERVICES, "worker": {**SERVICES["worker"], "restart": 5}}}
    assert list(jsonschema.Draft7Validator(SCHEMA).iter_errors(broken)), "the schema check can fail"


def test_compose_runs_the_whole_stack_with_health_and_order() -> None:
    assert set(SERVICES) >= {"postgres", "migrate", *KENNING_SERVICES}
    postgres = SERVICES["postgres"]
    assert "healthcheck" in postgres and any(v.startswith("pgdata:") for v in postgres["volumes"])
    assert "pgdata" in COMPOSE["volumes"]
    assert SERVICES["migrate"]["command"] == ["migrate"] and SERVICES["migrate"]["restart"] == "no"
    for name in KENNING_SERVICES:
        service = SERVICES[name]
        assert service["restart"] == "unless-stopped", name
        assert "healthcheck" in service, name
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy", name
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
        assert "KENNING_DATABASE_URL" in service["environment"], name
    assert SERVICES["console"]["ports"] == ["127.0.0.1:8300:8300"]
    # published on loopback only: it may run without tokens (it says so: ingress.open)
    assert SERVICES["ingress"]["ports"] == ["127.0.0.1:8000:8000"]
    assert SERVICES["ingress"]["environment"]["KENNING_INGRESS_ALLOW_OPEN"] == "true"
    # scalable with --scale worker=N: no fixed name, no published port
    assert "container_name" not in SERVICES["worker"] and "ports" not in SERVICES["worker"]


def test_kenning_connects_as_a_plain_role_not_the_superuser() -> None:
    postgres = SERVICES["postgres"]
    superuser = postgres["environment"]["POSTGRES_USER"]
    assert "./deploy/postgres-init:/docker-entrypoint-initdb.d:ro" in postgres["volumes"]
    script = (REPO_ROOT / "deploy" / "postgres-init" / "10-kenning-role.sh").read_text()
    assert "CREATE ROLE kenning LOGIN NOSUPERUSER" in script and "CREATE DATABASE kenning OWNER kenning" in script
    assert os.access(REPO_ROOT / "deploy" / "postgres-init" / "10-kenning-role.sh", os.X_OK)
    for name in ("migrate", *KENNING_SERVICES):
        url = resolve(SERVICES[name]["environment"]["KENNING_DATABASE_URL"])
        assert url == "postgresql://kenning:kenning@postgres:5432/kenning", name
        assert superuser != "kenning"


def _commands(service: dict[str, Any]) -> list[list[str]]:
    found = []
    if "command" in service:
        found.append([resolve(a) for a in service["command"]])
    test = service.get("healthcheck", {}).get("test", [])
    if test and test[0] == "CMD" and test[1] == "kenning":
        found.append(test[2:])
    if test and test[0] == "CMD-SHELL" and "kenning " in test[1]:
        found.append(shlex.split(test[1].split("kenning ", 1)[1]))
    return found


# postgres, the brokers profile's and the observability profile's servers run images of
# their own, no kenning command
NOT_KENNING = ("postgres", "rabbitmq", "nats", "prometheus", "grafana", "otel-collector")


@pytest.mark.parametrize("name", sorted(n for n in SERVICES if n not in NOT_KENNING))
def test_every_command_and_variable_compose_uses_exists_in_the_cli(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service = SERVICES[name]
    for key in list(os.environ):
        if key.startswith("KENNING_"):
            monkeypatch.delenv(key)
    environment = {k: resolve(str(v)) for k, v in (service.get("environment") or {}).items()}
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    commands = _commands(service)
    assert commands, f"{name} runs no kenning command"
    for argv in commands:
        assert argv[0] in SUBCOMMANDS, f"{name}: unknown subcommand {argv[0]!r}"
        parser, _ = build_parser(argv)
        parser.parse_args(argv)  # exits 2 (fails the test) on an unknown flag or bad value
    # every KENNING_* variable must be one the service's own command declares, by the name
    # that command reads (a per-process setting has the process's name: KENNING_WORKER_...)
    main_command = commands[0]
    parser, _ = build_parser(main_command)
    (commands_action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = set(declared_variables(commands_action.choices[main_command[0]]).values())
    unknown = sorted(k for k in environment if k.startswith("KENNING_") and k not in known)
    assert unknown == [], f"{name}: compose sets variables `kenning {main_command[0]}` does not read: {unknown}"


def test_dockerfile_is_one_slim_non_root_image() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^USER kenning$", text, re.M)
    assert 'ENTRYPOINT ["kenning"]' in text
    for name in ("ingress", "worker", "scheduler", "relayer", "migrate", "sink"):
        assert SERVICES[name].get("build") == "." or SERVICES[name].get("image") == "kenning:local", name


def test_the_image_installs_every_extra_the_compose_settings_name() -> None:
    # the brokers profile's URLs (amqp://, nats://) need their clients in the image, or its
    # ingress and relayer exit 2 at start ("needs the aio-pika client")
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    compose = (REPO_ROOT / "compose.yaml").read_text()
    needed = {extra for scheme, extra in (("amqp://", "amqp"), ("nats://", "nats")) if scheme in compose}
    assert needed == {"amqp", "nats"} and needed <= set(extras)
    text = (REPO_ROOT / "Dockerfile").read_text()
    (wheel,) = re.findall(r"^RUN pip wheel .*$", text, re.M)
    defaults = dict(re.findall(r"^ARG (\w+)=(\S*)$", text, re.M))
    built = re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), ""), wheel)
    found = re.search(r"\.\[([\w,]*)\]", built)
    assert found is not None, f"the image's wheel is built without extras: {wheel}"
    assert needed <= set(found.group(1).split(",")), built
