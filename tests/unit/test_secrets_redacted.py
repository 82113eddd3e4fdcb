"""Secrets kept out of what is shown (issue 25, item 8), the redaction itself: every URL and
conninfo form the drivers accept is shown without its secret, and a URL libpq would
misread is refused without it. The real processes given those secrets:
``tests/system/test_secrets_redacted.py``."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kenning.core.database_urls import libpq_url, redacted
from kenning.core.urls import hide_credentials, split_url
from kenning.errors import ConfigurationError


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # a password with a raw character a parser stops at: hidden whole, up to the last "@"
        ("postgresql://u:pa/ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:pa?ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:pa#ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:pa:ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:p@ss@h:5432/db?sslmode=require", "postgresql://u:***@h:5432/db?sslmode=require"),
        ("postgresql://u:pw@h1:5432,h2:5433/db", "postgresql://u:***@h1:5432,h2:5433/db"),
        # secrets in the query, whatever their case or encoding
        (
            "postgresql://h/db?user=u&password=pw&sslmode=require",
            "postgresql://h/db?user=u&password=***&sslmode=require",
        ),
        ("postgres://h/db?sslpassword=pw&PASSWORD=pw#x", "postgres://h/db?sslpassword=***&PASSWORD=***"),
        ("postgresql://h/db?pass%77ord=pw", "postgresql://h/db?pass%77ord=***"),
        ("nats://h:4222?token=t&auth_token=t&nkeys_seed=s", "nats://h:4222?token=***&auth_token=***&nkeys_seed=***"),
        # a user name alone is the secret of NATS's token form (not when told it is not)
        ("nats://tok/en@h:4222?stream=s", "nats://***@h:4222?stream=s"),
        ("amqps://u:p/w@rabbit/vhost?queue=q", "amqps://u:***@rabbit/vhost?queue=q"),
        # "@" in the query after none in the authority: more hidden than needed, never less
        ("postgresql://h/db?password=p@w", "postgresql://***@w"),
        ("postgresql://h/db?application_name=a@b", "postgresql://***@b"),
        # libpq's key=value form: plain, quoted with escapes and blanks, unclosed
        ("host=h password=pw dbname=d", "host=h password=*** dbname=d"),
        ("host=h password = 'p w\\'x\\\\' dbname=d", "host=h password = *** dbname=d"),
        ("host='h'password=pw", "host='h'password=***"),
        ("password='p w", "password=***"),
        ("sslpassword=p\\ w user=u", "sslpassword=*** user=u"),
        # too malformed to tell its parts apart: nothing but the scheme
        ("amqp://u:pw@[::1/x", "amqp://***"),
        # a scheme no URL has: nothing before the last "@"
        ("pg_sql://u:pw@h/db", "***@h/db"),
        ("http://hooks.example/in", "http://hooks.example/in"),
        ("", ""),
    ],
)
def test_every_form_is_shown_without_its_secret(url: str, shown: str) -> None:
    assert hide_credentials(url) == shown


def test_a_database_user_stays_and_the_url_is_shown_as_sqlalchemy_reads_it() -> None:
    assert hide_credentials("postgresql://u@h/db?password=pw", user_is_secret=False) == (
        "postgresql://u@h/db?password=***"
    )
    assert redacted("postgresql://u:pa?ss#w@h/db") == "postgresql+psycopg://u:***@h/db"
    assert redacted("host=h password=pw") == "<unparsable database URL>"


# any character but NUL in a password: the drivers take them all, raw or encoded
_PASSWORDS = st.text(st.characters(exclude_characters="\x00"), min_size=1)


@given(_PASSWORDS)
def test_any_password_in_a_url_is_hidden_whole(password: str) -> None:
    assert hide_credentials(f"postgresql://kenning:{password}@db:5432/app") == "postgresql://kenning:***@db:5432/app"
    assert hide_credentials(f"amqp://u:{password}@rabbit/v?queue=q") == "amqp://u:***@rabbit/v?queue=q"


@given(_PASSWORDS.filter(lambda p: "&" not in p and "@" not in p))
def test_any_password_parameter_is_hidden_whole(password: str) -> None:
    assert hide_credentials(f"postgresql://db/app?password={password}&sslmode=require") == (
        "postgresql://db/app?password=***&sslmode=require"
    )


@given(_PASSWORDS)
def test_any_quoted_conninfo_password_is_hidden_whole(password: str) -> None:
    quoted = "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"
    assert hide_credentials(f"host=db password={quoted} dbname=app") == "host=db password=*** dbname=app"


@given(st.text())
def test_the_redaction_never_raises(text: str) -> None:
    hide_credentials(text)
    hide_credentials(text, user_is_secret=False)
    redacted(text)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("postgresql://u:Secret1@Secret2@h/db", "its host holds an '@'"),
        ("postgresql://u:Secret1/Secret2@h/db", "its port is not a number"),
        ("postgresql://u:Secret1@[::1/Secret2", "end of string reached"),  # libpq quotes the whole URL
        ("postgresql://u:Secret1%zzSecret2@h/db", "invalid percent-encoded token"),  # ... or the token
        ("postgresql://u@h/db?password=Secret1=Secret2", "extra key/value separator"),
        ("host=h password=Secret1Secret2", "must start with postgresql://"),
        ("host=h password=Secret1://Secret2", "must start with postgresql://"),
    ],
)
def test_a_database_url_libpq_would_misread_is_refused_without_its_secret(url: str, reason: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        libpq_url(url)
    assert reason in str(refused.value)
    assert "Secret1" not in str(refused.value) and "Secret2" not in str(refused.value)


def test_a_broker_url_refusal_does_not_quote_what_urllib_took_for_a_port() -> None:
    with pytest.raises(ConfigurationError) as refused:
        split_url("amqp://guest:Secret1/Secret2@rabbit:5672/?exchange=x", "broker URL")
    assert str(refused.value) == (
        "broker URL 'amqp://guest:***@rabbit:5672/?exchange=x' is invalid: Port is not a number "
        "(percent-encode a '/', '?', '#' or '@' in a password: %2F, %3F, %23, %40)"
    )


class Secrets:
    """Marker words, each unique to this test run, and where they were found."""

    def __init__(self) -> None:
        self.run = uuid.uuid4().hex[:6]
        self.words: list[str] = []

    def word(self, name: str) -> str:
        word = f"Sx{name}{self.run}"
        self.words.append(word)
        return word

    def leaks(self, texts: dict[str, str]) -> list[str]:
        return [
            f"{word} in {where}: {line.strip()[:300]}"
            for where, text in texts.items()
            for line in text.splitlines()
            for word in self.words
            if word in line
        ]


def conninfo(database_url: str, password: str) -> str:
    parts = urlsplit(database_url)
    quoted = password.replace("\\", "\\\\").replace("'", "\\'")
    return (
        f"host={parts.hostname or '127.0.0.1'} port={parts.port or 5432} user={parts.username or 'postgres'} "
        f"password='{quoted}' dbname={parts.path.lstrip('/')}"
    )
