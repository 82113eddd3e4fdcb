"""URLs with their credentials hidden, for logs and error messages: the database's, a
broker target's (the relayer) and a source's (the ingress) are shown the same way."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

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
