"""A worker's explicit code version (``--code-version`` / ``KENNING_CODE_VERSION``,
docs/operations.md#version-pinning): what it accepts, what it refuses and how, and that
without it the version is one fingerprint of all the worker's workflows."""

from __future__ import annotations

import argparse
import re

import pytest

from kenning.errors import ConfigurationError
from kenning.hosting.config import add_settings, declared_variables, settings_from_args
from kenning.hosting.presence import code_version
from kenning_worker.worker import CODE_VERSION_MAX_LENGTH, WorkerSettings, check_code_version


@pytest.mark.parametrize(
    "given",
    [
        "2026.12.1",
        "v7",
        "release-2026-12-06+build.41",
        "3f9c2e1d0b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e",  # a git SHA
        "sha256:" + "ab" * 32,  # an image digest, 71 characters
        "x" * CODE_VERSION_MAX_LENGTH,
        "版本-1",  # printable, not ASCII
    ],
)
def test_a_build_id_is_kept_as_given(given: str) -> None:
    assert check_code_version(given) == given
    assert WorkerSettings(code_version=given).code_version == given


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("", "must not be empty"),
        (" ", "must be printable characters without spaces"),
        ("2026.12.1 ", "must be printable characters without spaces"),
        ("2026.12 rc1", "must be printable characters without spaces"),
        ("a\tb", "must be printable characters without spaces"),
        ("a\nb", "must be printable characters without spaces"),
        ("a\x00b", "must be printable characters without spaces"),
        ("a\x1b[2Jb", "must be printable characters without spaces"),
        ("a\u200bb", "must be printable characters without spaces"),  # zero-width space
        ("x" * (CODE_VERSION_MAX_LENGTH + 1), f"must be at most {CODE_VERSION_MAX_LENGTH} characters, got 129"),
    ],
)
def test_a_bad_code_version_is_refused_naming_the_setting(given: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        check_code_version(given)
    with pytest.raises(ConfigurationError) as refused:
        WorkerSettings(code_version=given)
    message = str(refused.value)
    assert message.startswith("--code-version / KENNING_CODE_VERSION ") and problem in message
    assert "\n" not in message and len(message) < 200  # one line, a long value cut short


def test_unset_is_the_fingerprint_and_the_flag_and_variable_are_declared_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert WorkerSettings().code_version is None
    parser = argparse.ArgumentParser()
    add_settings(parser, WorkerSettings)
    assert declared_variables(parser)["--code-version"] == "KENNING_CODE_VERSION"  # shared, not per process
    parsed = settings_from_args(WorkerSettings, parser.parse_args(["--code-version", "2026.12.2"]))
    assert parsed.code_version == "2026.12.2"

    monkeypatch.setenv("KENNING_CODE_VERSION", "2026.12.1")
    from_env = argparse.ArgumentParser()
    add_settings(from_env, WorkerSettings)
    assert settings_from_args(WorkerSettings, from_env.parse_args([])).code_version == "2026.12.1"
    # the flag wins over the variable
    assert settings_from_args(WorkerSettings, from_env.parse_args(["--code-version", "x"])).code_version == "x"


def test_the_fingerprint_is_one_version_for_all_the_workers_workflows() -> None:
    # only workflow b's source changes: a's is the same, yet the worker's version is another,
    # so a's pinned instances wait for the old one (whole-deployment semantics)
    before = code_version({"a": "source of a", "b": "source of b"})
    after = code_version({"a": "source of a", "b": "source of b, changed"})
    assert before != after
    # and a worker running a alone has a version of its own, which b's changes leave alone
    assert code_version({"a": "source of a"}) not in (before, after)
