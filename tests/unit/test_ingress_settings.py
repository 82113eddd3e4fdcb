"""The ingress's settings: each field one declared option, filled by its flag."""

from __future__ import annotations

import argparse
import dataclasses
import os

import pytest

from kenning.hosting.config import declared_variables, options
from kenning_ingress.main import add_arguments, settings_from
from kenning_ingress.parsing import DEFAULT_LIMITS, EventLimits
from kenning_ingress.settings import IngressSettings


def test_every_setting_has_exactly_one_option_and_the_flags_fill_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("KENNING_")]:  # the shell's settings stay out
        monkeypatch.delenv(key)
    declared_options = list(options(IngressSettings))
    assert sorted(o.path for o in declared_options) == sorted((f.name,) for f in dataclasses.fields(IngressSettings))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    declared = declared_variables(parser)
    assert all(declared[o.flag] == o.variable for o in declared_options)
    given = [
        "--database-url=postgresql://u@h/d",
        "--ingress-max-id-length=7",
        "--ingress-read-timeout=2.5",
        "--admin-token=a",
    ]
    settings = settings_from(parser.parse_args(given))
    assert settings == IngressSettings(
        database_url="postgresql://u@h/d", admin_token="a", read_timeout=2.5, max_id_length=7
    )
    assert settings.limits == EventLimits(max_id_length=7)


def test_the_event_limits_default_to_the_parsers() -> None:
    assert IngressSettings().limits == DEFAULT_LIMITS
