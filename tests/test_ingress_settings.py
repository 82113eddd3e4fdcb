"""The ingress's settings table: each field filled by one declared option."""

from __future__ import annotations

import argparse
import dataclasses
import os

import pytest

from kenning.config import declared_variables
from kenning_ingress.main import add_arguments, settings_from
from kenning_ingress.parsing import EventLimits
from kenning_ingress.settings import OPTIONS, IngressSettings


def test_every_setting_has_exactly_one_option_and_the_flags_fill_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("KENNING_")]:  # the shell's settings stay out
        monkeypatch.delenv(key)
    fields = {f.name for f in dataclasses.fields(IngressSettings)} - {"database_url", "limits"}
    fields |= {f"limits.{f.name}" for f in dataclasses.fields(EventLimits)}
    assert sorted(o.field for o in OPTIONS) == sorted(fields)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    declared = declared_variables(parser)
    assert all(declared[o.flag] == o.variable for o in OPTIONS)
    given = [
        "--database-url=postgresql://u@h/d",
        "--ingress-max-id-length=7",
        "--ingress-read-timeout=2.5",
        "--admin-token=a",
    ]
    settings = settings_from(parser.parse_args(given))
    assert settings == IngressSettings(
        database_url="postgresql://u@h/d",
        admin_token="a",
        read_timeout=2.5,
        limits=EventLimits(max_id_length=7),
    )
