"""Values PostgreSQL cannot store, found before any write (issue 13, item 2): the first bad
value named, encoded errors always storable, a data exception the write's fault. The
writes themselves: ``tests/integration/test_unstorable.py``."""

from __future__ import annotations

import pytest

from kenning import TerminalError, UnstorableValueError, serialization
from kenning.db.errors import is_data_error, is_unavailable


def test_storable_json_finds_the_first_bad_value() -> None:
    assert serialization.storable_json({"a": [1, "x"]}, "result") == {"a": [1, "x"]}
    assert serialization.storable_json("emoji \U0001f600 and a backslash-u \\u0000", "result")
    with pytest.raises(UnstorableValueError, match=r"at \$\['a b'\]\[0\]"):
        serialization.storable_json({"a b": ["\x00"]}, "result")
    with pytest.raises(UnstorableValueError, match=r"contains a NUL character in a key at \$"):
        serialization.storable_json({"k\x00": 1}, "result")
    with pytest.raises(UnstorableValueError, match=r"surrogate code point at \$\[0\]"):
        serialization.storable_json(["\ud800"], "result")
    with pytest.raises(UnstorableValueError, match=r"NaN or an infinity at \$.x"):
        serialization.storable_json({"x": float("inf")}, "result")
    with pytest.raises(UnstorableValueError, match="cannot be stored as JSON"):
        serialization.storable_json(object(), "result")
    assert isinstance(UnstorableValueError("x"), TerminalError)


def test_encoded_errors_are_always_storable() -> None:
    encoded = serialization.encode_error(ValueError("a\x00b\ud800"))
    assert encoded["message"] == "a\\x00b\\ud800"  # escaped as Python writes them
    assert encoded["args"] is None  # rebuilt from the message on replay
    assert serialization.unstorable_reason(encoded) is None
    rebuilt = serialization.decode_error(encoded)
    assert type(rebuilt) is ValueError and str(rebuilt) == "a\\x00b\\ud800"


def test_data_exceptions_are_the_writes_fault_not_an_outage() -> None:
    class UntranslatableError(Exception):
        sqlstate = "22P05"

    from sqlalchemy.exc import DataError, OperationalError

    untranslatable = DataError("INSERT", {}, UntranslatableError())
    assert is_data_error(untranslatable) and not is_unavailable(untranslatable)
    gone = OperationalError("INSERT", {}, ConnectionError())
    assert not is_data_error(gone)
    assert is_data_error(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"))
    client_side = DataError("INSERT", {}, Exception("PostgreSQL text fields cannot contain NUL (0x00) bytes"))
    assert is_data_error(client_side) and not is_unavailable(client_side)
