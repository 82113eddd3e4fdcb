"""URLs with their credentials hidden, for logs, error messages and metric labels: the
database's, a broker target's (the relayer) and a source's (the ingress) are shown the same
way. And the checks a broker URL of either side gets before the process starts: well formed,
and only the options its form takes."""

from __future__ import annotations

import re
from collections.abc import Collection
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from kenning.errors import ConfigurationError

HIDDEN = "***"

# "scheme://", after any blank a variable may carry in front
_URL_HEAD = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")
# a parameter that holds a secret, by its name: libpq's password and sslpassword, a broker's
# password, token, auth_token, NATS's nkeys seed, and whatever else calls itself so
_SECRET_NAME = re.compile(r"pass|pwd|token|secret|seed|nkey|jwt|api_?key|credential|signature", re.IGNORECASE)
# characters no user name in an authority holds: such a "user" is more of the URL than that
_NOT_A_USER = re.compile(r"[/?#@&=\[\]\s]")
# one "keyword = value" of a libpq conninfo string, after a blank or a closing quote; a
# value is quoted ('...', with \' and \\) or runs to the next blank (a backslash escapes
# one character); an unclosed quote runs to the end
_CONNINFO_PAIR = re.compile(
    r"""(?<![^\s'])(?P<key>[^\s=]+)(?P<equals>\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*(?:'|\\?\Z)|(?:[^\s\\]|\\.)*\\?)""",
    re.DOTALL,
)


def hide_credentials(url: str, *, user_is_secret: bool = True) -> str:
    """``url`` as it may be shown: a URL's password as ``user:***@``, the value of every
    parameter named like a secret (``?password=``, ``sslpassword``, ``token``...) as
    ``***``, and the same for a libpq conninfo string (``host=h password='x y'``).

    A URL's credentials run to its LAST ``@``: a password holding a raw ``/``, ``?``,
    ``#``, ``:`` or ``@`` is hidden whole, whatever a driver makes of it (libpq stops at
    the first ``@``, urllib at the first ``/``, ``?`` or ``#``); with ``@`` later in the
    URL than the credentials, more is hidden than needed, never less. A user name without
    a password is hidden too (``***@``) when ``user_is_secret``: NATS's token form,
    ``nats://TOKEN@host``; a database's user name is not a secret and stays. A URL too
    malformed to tell its parts apart (an unbalanced ``[``) shows only its scheme. Never
    raises."""
    head = _URL_HEAD.match(url)
    if head is not None:
        return _hide_in_url(head.group(0), url[head.end() :], user_is_secret=user_is_secret)
    hidden = _CONNINFO_PAIR.sub(_hide_pair, url)
    if "://" in hidden and "@" in hidden:  # a URL of no scheme we can read: nothing before its last "@"
        return f"{HIDDEN}@{hidden.rpartition('@')[2]}"
    return hidden


def _hide_in_url(head: str, rest: str, *, user_is_secret: bool) -> str:
    credentials, at, location = rest.rpartition("@")
    path, question, query = location.partition("?")
    location = path + question + "&".join(_hide_parameter(pair) for pair in query.split("&")) if question else path
    try:
        urlsplit(head + location)
    except ValueError:  # an unbalanced "[" and the like: nothing of it is shown
        return f"{head.strip()}{HIDDEN}"
    if not at:
        return head + location
    return f"{head}{_shown_credentials(credentials, user_is_secret=user_is_secret)}@{location}"


def _shown_credentials(credentials: str, *, user_is_secret: bool) -> str:
    user, colon, _password = credentials.partition(":")
    if not user or _NOT_A_USER.search(user):
        return HIDDEN
    if colon:
        return f"{user}:{HIDDEN}"
    return HIDDEN if user_is_secret else user


def _hide_parameter(pair: str) -> str:
    name, equals, _value = pair.partition("=")
    return f"{name}={HIDDEN}" if equals and _SECRET_NAME.search(unquote(name)) else pair


def _hide_pair(pair: re.Match[str]) -> str:
    if not _SECRET_NAME.search(pair.group("key")):
        return pair.group(0)
    return f"{pair.group('key')}{pair.group('equals')}{HIDDEN}"


def split_url(url: str, what: str) -> SplitResult:
    """``url`` in parts, its port checked; a malformed one is a ``ConfigurationError``
    naming ``what`` (``"source"``, ``"broker URL"``) and the URL, its credentials hidden:
    the error must not carry a password or token."""
    try:
        parsed = urlsplit(url)
        _ = parsed.port  # raises ValueError for a malformed port
    except ValueError as error:
        raise ConfigurationError(f"{what} {hide_credentials(url)!r} is invalid: {_reason(error)}") from None
    return parsed


def _reason(error: ValueError) -> str:
    """What urllib found wrong, without the part of the URL it quotes: a "port" that is
    not a number is often the start of a password holding a raw ``/``, ``?`` or ``#``."""
    text = str(error)
    if text.startswith("Port could not be cast"):
        return "Port is not a number (percent-encode a '/', '?', '#' or '@' in a password: %2F, %3F, %23, %40)"
    if "'" in text or '"' in text:  # it quotes part of the URL (the host, the netloc)
        return "not a well-formed URL"
    return text


def query_options(url: str, allowed: Collection[str], what: str) -> dict[str, str]:
    """The query of ``url`` (checked by ``split_url``) as options; an unknown or repeated
    one is a ``ConfigurationError`` naming ``what`` and the options its scheme takes."""
    parsed = urlsplit(url)
    options: dict[str, str] = {}
    for key, value in parse_qsl(parsed.query, keep_blank_values=True):
        if key not in allowed:
            raise ConfigurationError(
                f"{what} {hide_credentials(url)!r} has unknown option {key!r}; "
                f"{parsed.scheme}:// takes {', '.join(allowed)}"
            )
        if key in options:
            raise ConfigurationError(f"{what} {hide_credentials(url)!r} gives {key!r} twice")
        options[key] = value
    return options
