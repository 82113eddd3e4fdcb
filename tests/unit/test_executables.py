"""A system program in an ``sbin`` folder is found with a PATH that lacks it (``env -i``,
cron, a container's), and one on PATH wins."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kenning.hosting import executables


def _program(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_program_only_in_an_sbin_folder_is_found_with_a_bare_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sbin = _program(tmp_path / "sbin", "kt-useradd")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(executables, "SBIN_FOLDERS", ("/nonexistent", str(tmp_path / "sbin")))
    assert executables.find_executable("kt-useradd") == str(sbin)
    assert executables.find_executable("kt-absent") is None


def test_one_on_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _program(tmp_path / "sbin", "kt-tool")
    mine = _program(tmp_path / "bin", "kt-tool")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(executables, "SBIN_FOLDERS", (str(tmp_path / "sbin"),))
    assert executables.find_executable("kt-tool") == str(mine)


def test_the_standard_sbin_folders_are_searched() -> None:
    assert {"/usr/sbin", "/sbin"} <= set(executables.SBIN_FOLDERS)
