"""The payload boundary (issue 36, item 1): the codec chain, AES-256-GCM with keys by id,
and ``seal``/``unseal`` as every stored user payload crosses them."""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterator

import pytest

from kenning import codecs
from kenning.errors import ConfigurationError

K1 = "k1:" + base64.b64encode(b"1" * 32).decode()
K2 = "k2:" + base64.b64encode(b"2" * 32).decode()


@pytest.fixture(autouse=True)
def fresh_chain(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(codecs.KEYS_VARIABLE, raising=False)
    codecs.reset()
    yield
    codecs.reset()


class Zlib:
    def encode(self, value: bytes) -> bytes:
        return zlib.compress(value)

    def decode(self, value: bytes) -> bytes:
        return zlib.decompress(value)


class Tag:
    def __init__(self, tag: bytes) -> None:
        self.tag = tag

    def encode(self, value: bytes) -> bytes:
        return self.tag + value

    def decode(self, value: bytes) -> bytes:
        assert value.startswith(self.tag), (self.tag, value[:8])
        return value[len(self.tag) :]


def test_a_chain_encodes_in_order_and_decodes_in_reverse() -> None:
    chain = codecs.CodecChain([Tag(b"a"), Tag(b"b")])
    assert chain.encode(b"x") == b"bax"
    assert chain.decode(b"bax") == b"x"


def test_without_codecs_a_value_is_stored_as_it_is() -> None:
    assert codecs.seal({"card": "4111"}) == {"card": "4111"}
    assert codecs.unseal({"card": "4111"}) == {"card": "4111"}


def test_with_keys_the_stored_form_holds_no_plaintext_and_names_its_key() -> None:
    codecs.configure(keys=f"{K2},{K1}")
    sealed = codecs.seal({"card": "MARKER-4111"})
    assert set(sealed) == {"$enc", "v"} and sealed["$enc"] == "k2"
    assert "MARKER" not in repr(sealed)
    assert codecs.unseal({"nested": [sealed]}) == {"nested": [{"card": "MARKER-4111"}]}


def test_a_rotated_key_still_opens_what_the_old_one_sealed() -> None:
    codecs.configure(keys=K1)
    old = codecs.seal("history")
    codecs.configure(keys=f"{K2},{K1}")
    assert codecs.unseal(old) == "history"
    assert codecs.seal("new")["$enc"] == "k2"


def test_without_the_key_a_payload_is_shown_as_encrypted() -> None:
    codecs.configure(keys=K1)
    sealed = codecs.seal({"x": 1})
    codecs.configure(keys="")
    assert codecs.shown(sealed) == "encrypted"
    with pytest.raises(codecs.PayloadEncryptedError, match="KENNING_ENCRYPTION_KEYS is not set"):
        codecs.unseal(sealed)


def test_a_missing_or_wrong_key_is_one_line_naming_it() -> None:
    codecs.configure(keys=K1)
    sealed = codecs.seal({"x": 1})
    codecs.configure(keys=K2)
    with pytest.raises(codecs.EncryptionKeyError, match="key 'k1', which KENNING_ENCRYPTION_KEYS does not hold"):
        codecs.unseal(sealed)
    codecs.configure(keys="k1:" + base64.b64encode(b"9" * 32).decode())
    with pytest.raises(codecs.EncryptionKeyError, match="does not decrypt with key 'k1'") as caught:
        codecs.unseal(sealed)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("k1", "entry 1 is not <key id>:<base64 of 32 bytes>"),
        ("k1:!!!", "key 'k1' is not valid base64"),
        ("k1:" + base64.b64encode(b"short").decode(), "key 'k1' is 5 bytes, AES-256 needs 32"),
        (f"{K1},{K1}", "key id 'k1' is given twice"),
    ],
)
def test_a_malformed_key_setting_is_refused_naming_the_entry(text: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as caught:
        codecs.configure(keys=text)
    assert base64.b64encode(b"1" * 32).decode() not in str(caught.value)


def test_users_codecs_run_before_encryption_and_after_it_when_asked() -> None:
    codecs.register(Zlib())
    codecs.register(Tag(b"S3:"), after_encryption=True)
    codecs.configure(keys=K1)
    chain = codecs.chain()
    assert [type(c).__name__ for c in chain.codecs] == ["Zlib", "AesGcmCodec", "Tag"]
    sealed = codecs.seal("x" * 1000)
    assert base64.b64decode(sealed["v"]).startswith(b"S3:")
    assert codecs.unseal(sealed) == "x" * 1000


def test_users_codecs_alone_seal_with_no_key_id() -> None:
    codecs.register(Zlib())
    sealed = codecs.seal({"a": 1})
    assert sealed["$enc"] == ""
    assert codecs.unseal(sealed) == {"a": 1}


def test_register_refuses_what_is_no_codec() -> None:
    with pytest.raises(TypeError, match="is not a PayloadCodec"):
        codecs.register(object())  # type: ignore[arg-type]


def test_a_stored_error_keeps_its_type_plain_and_its_message_sealed() -> None:
    from kenning import serialization

    codecs.configure(keys=K1)
    encoded = serialization.encode_error(ValueError("MARKER-card"))
    assert encoded["type"] == "builtins.ValueError"
    assert "MARKER" not in repr(encoded)
    rebuilt = serialization.decode_error(encoded)
    assert isinstance(rebuilt, ValueError) and str(rebuilt) == "MARKER-card"
