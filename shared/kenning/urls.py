"""URLs with their credentials hidden, for logs and error messages: the database's, a
broker target's (the relayer) and a source's (the ingress) are shown the same way. And the
checks a broker URL of either side gets before the process starts: well formed, and only
the options its form takes."""

from __future__ import annotations

import re
from collections.abc import Collection
from urllib.parse import SplitResult, parse_qsl, urlsplit

from kenning.errors import ConfigurationError

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*(?=://)")


def hide_credentials(url: str, *, user_is_secret: bool = True) -> str:
    """``url`` with a password shown as ``user:***@``, and all but the scheme of a URL too
    malformed to tell its parts apart. A user name without a password is hidden too
    (``***@``) when ``user_is_secret``: NATS's token form, ``nats://TOKEN@host``; a
    database's user name is not a secret and stays."""
    try:
        parsed = urlsplit(url)
        password = parsed.password
    except ValueError:  # an unbalanced "[" and the like: nothing of it is shown
        scheme = _SCHEME.match(url)
        return f"{scheme.group(0)}://***" if scheme else "***"
    if "@" not in parsed.netloc or (password is None and not user_is_secret):
        return url
    credentials = "***" if password is None else f"{parsed.username}:***"
    return parsed._replace(netloc=f"{credentials}@{parsed.netloc.rsplit('@', 1)[1]}").geturl()


def split_url(url: str, what: str) -> SplitResult:
    """``url`` in parts, its port checked; a malformed one is a ``ConfigurationError``
    naming ``what`` (``"source"``, ``"broker URL"``) and the URL, its credentials hidden:
    the error must not carry a password or token."""
    try:
        parsed = urlsplit(url)
        _ = parsed.port  # raises ValueError for a malformed port
    except ValueError as error:
        raise ConfigurationError(f"{what} {hide_credentials(url)!r} is invalid: {error}") from None
    return parsed


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
