"""Who may use the console, and what protects its forms.

- **Admin token** (``KENNING_ADMIN_TOKEN``, when set): a request is let in with
  ``Authorization: Bearer <token>`` (scripts, tests) or with the session cookie a browser
  gets by typing the token into ``/login``. The cookie holds no token: it is
  ``<issued_at>.<HMAC(key, issued_at)>``, the key an HMAC of a fixed label keyed with the
  token. So any console replica with the same token checks it (no session store), it proves
  knowledge of the token, it dies when the token changes, and a copied cookie dies
  ``--console-session-hours`` after login whatever the browser does (logout only clears it
  in the browser that logs out: a server-side revocation list would need shared state).
  ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it),
  ``Secure`` behind HTTPS. Every comparison is ``hmac.compare_digest``. A wrong token (at
  ``/login`` or as bearer) is answered after ``WRONG_TOKEN_DELAY``, slowing a guesser; the
  wait is an ``asyncio.sleep`` in that request alone. Without a token the console is open,
  and ``kenning console`` refuses to listen beyond loopback unless told to.
- **CSRF**: every POST form carries ``csrf_token`` (``csrf_field()`` in templates), checked
  by ``require_csrf``. The token is bound to this browser's session: an HMAC, keyed with a
  secret (derived from the admin token, or made at start for an open console), of the
  ``kenning_csrf`` cookie (a random id each browser gets on its first request) and the login
  session cookie. A cookie another page planted (a page on another port of the same host
  can set cookies for this one: ports do not separate cookies) therefore gives that page no
  token it can compute; a plain double-submit cookie was forged exactly so.
- **Origin check** on every state-changing request (any method but GET, HEAD, OPTIONS), in
  the middleware, before anything runs: ``Sec-Fetch-Site`` ``cross-site`` or ``same-site``
  (another port of the same host is same-site) is refused, and ``Origin`` (or, absent,
  ``Referer``) must name this console (the request's ``Host``, or ``X-Forwarded-Host``
  behind a proxy); a request naming neither is refused too. Browsers send ``Origin`` on
  every POST; the console's ``Referrer-Policy: same-origin`` keeps it (``no-referrer`` would
  make the browser send ``Origin: null`` on the console's own forms). A script with the admin
  token as bearer header needs none of this: no browser sends that header by itself.
  Refusals answer 403 with the reason.
- **Host check** without a token: a request is answered only if its ``Host`` is
  ``localhost``, ``127.0.0.1`` or ``[::1]`` (any port) or one of ``--console-allowed-hosts``.
  A web page that rebinds its own name to 127.0.0.1 (DNS rebinding) reaches the console
  as same-origin, with its own name as ``Host``: refused, so it reads nothing.
- **Headers** on every response: a strict Content-Security-Policy (only the console's own
  CSS, script and connections; no inline script or style), ``nosniff``, no framing, the
  referrer sent to the console itself only, no caching of pages.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from urllib.parse import parse_qsl, quote, urlsplit

import structlog
from starlette.datastructures import FormData, MutableHeaders, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request, cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_log = structlog.get_logger("kenning.console")

SESSION_COOKIE = "kenning_session"
CSRF_COOKIE = "kenning_csrf"
CSRF_FIELD = "csrf_token"
_SESSION_KEY_LABEL = b"kenning console session key v2"
_CSRF_KEY_LABEL = b"kenning console csrf key v1"
# methods that change nothing: every other one must come from the console's own pages
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Sec-Fetch-Site values a state-changing request may carry ("none": typed or bookmarked)
OWN_SITES = frozenset({"same-origin", "none"})
DEFAULT_PORTS = {"http": "80", "https": "443"}
# a cookie dated this far ahead of the console's clock is still taken (replicas' clocks differ)
CLOCK_SKEW_SECONDS = 60
# how long a wrong token's answer waits: a few guesses a second per connection, not thousands
WRONG_TOKEN_DELAY = 0.5
# paths anyone may reach: the login form, the health check, Prometheus's scrape (request
# counts, no workflow's data: kenning_console.metrics), and under the static mount the
# stylesheet and script the login form uses (exact paths: "/loginx" is not public)
PUBLIC_PATHS = frozenset({"/login", "/healthz", "/readyz", "/metrics"})
STATIC_PREFIX = "/static/"
# the Host an open console answers to, whatever the port (and --console-allowed-hosts)
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # not no-referrer: under it a browser sends "Origin: null" with the console's own forms
    "referrer-policy": "same-origin",
}


def _session_mac(admin_token: str, issued_at: str) -> str:
    key = hmac.new(admin_token.encode("utf-8"), _SESSION_KEY_LABEL, hashlib.sha256).digest()
    return hmac.new(key, issued_at.encode("ascii"), hashlib.sha256).hexdigest()


def session_value(admin_token: str, issued_at: int | None = None) -> str:
    """What the session cookie holds once the browser proved it knows ``admin_token``:
    ``<issued_at>.<mac>`` (Unix seconds, now unless given)."""
    stamp = str(int(time.time()) if issued_at is None else issued_at)
    return f"{stamp}.{_session_mac(admin_token, stamp)}"


def session_valid(cookie: str, admin_token: str, lifetime_seconds: float) -> bool:
    """The cookie was made by :func:`session_value` with this token, within its lifetime."""
    stamp, _, mac = cookie.partition(".")
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        return False
    expected = _session_mac(admin_token, stamp)
    if not hmac.compare_digest(mac.encode("utf-8"), expected.encode("ascii")):
        return False
    age = time.time() - int(stamp)
    return -CLOCK_SKEW_SECONDS <= age <= lifetime_seconds


def token_matches(presented: str, admin_token: str) -> bool:
    return hmac.compare_digest(presented.encode("utf-8"), admin_token.encode("utf-8"))


def csrf_key(admin_token: str) -> bytes:
    """The secret form tokens are made with: derived from the admin token (every replica
    with the token makes the same ones), else random for this process (an open console's
    forms then need a reload after a restart)."""
    if admin_token:
        return hmac.new(admin_token.encode("utf-8"), _CSRF_KEY_LABEL, hashlib.sha256).digest()
    return secrets.token_bytes(32)


def form_token(key: bytes, browser: str, session: str) -> str:
    """The CSRF token of the browser whose ``kenning_csrf`` cookie is ``browser`` and whose
    login session cookie is ``session`` ("" before login, or on an open console)."""
    return hmac.new(key, f"{browser}\n{session}".encode(), hashlib.sha256).hexdigest()


def _cookies(scope: Scope) -> dict[str, str]:
    """The request's cookies, parsed as browsers send them (Starlette's parser, as
    ``request.cookies``): ``http.cookies.SimpleCookie`` drops every cookie after one it
    cannot read, such as another localhost app's ``prefs={"theme": "dark"}``."""
    found: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            found.update(cookie_parser(value.decode("latin-1")))
    return found


def _header(scope: Scope, wanted: bytes) -> str:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return str(value.decode("latin-1"))
    return ""


def _bearer(scope: Scope) -> str | None:
    """The bearer token the request presents, if it presents one."""
    scheme, _, presented = _header(scope, b"authorization").partition(" ")
    return presented.strip() if scheme.lower() == "bearer" else None


def authenticated(scope: Scope, admin_token: str, session_seconds: float) -> bool:
    """The request carries the admin token (bearer) or a live session cookie; always true
    without a token."""
    if not admin_token:
        return True
    bearer = _bearer(scope)
    if bearer is not None and token_matches(bearer, admin_token):
        return True
    return session_valid(_cookies(scope).get(SESSION_COOKIE, ""), admin_token, session_seconds)


def host_name(host: str) -> str:
    """``Host``'s name without its port, lower case: ``[::1]:8300`` -> ``[::1]``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.partition(":")[0]


def host_allowed(scope: Scope, allowed_hosts: frozenset[str]) -> bool:
    """The request names this console by a loopback name or an allowed one. No ``Host``
    at all is let through: browsers always send one, so it cannot be a rebound page."""
    host = _header(scope, b"host")
    return not host or host_name(host) in LOOPBACK_HOSTS | allowed_hosts or host.lower() in allowed_hosts


def _netloc(url: str) -> str:
    """``host[:port]`` of a URL, lower case, without its scheme's default port ("" if none)."""
    parts = urlsplit(url)
    netloc = parts.netloc.lower().rpartition("@")[2]
    default = DEFAULT_PORTS.get(parts.scheme.lower())
    if default and netloc.endswith(f":{default}"):
        netloc = netloc[: -len(default) - 1]
    return netloc


def _own_netlocs(scope: Scope) -> set[str]:
    """The names this request reached the console by: its ``Host``, and behind a proxy the
    ``X-Forwarded-Host`` it passes on (a page cannot set either on a form it submits)."""
    default = DEFAULT_PORTS["https" if is_https(scope) else "http"]
    own = set()
    for header in (b"host", b"x-forwarded-host"):
        value = _header(scope, header).split(",")[0].strip().lower()
        if value.endswith(f":{default}"):
            value = value[: -len(default) - 1]
        if value:
            own.add(value)
    return own


def cross_origin_refusal(scope: Scope) -> str | None:
    """Why a state-changing request did not come from the console's own pages, or None."""
    site = _header(scope, b"sec-fetch-site").strip().lower()
    if site and site not in OWN_SITES:
        return f"this request was sent by another site's page (Sec-Fetch-Site: {site}): use the console's own pages"
    origin = _header(scope, b"origin").strip()
    sender = origin or _header(scope, b"referer").strip()
    if not sender:
        return "this request does not say which page sent it (no Origin or Referer header): use the console's pages"
    if _netloc(sender) not in _own_netlocs(scope):
        named = "Origin" if origin else "Referer"
        return f"this request was sent by a page of {sender[:200]!r} ({named}), not of this console"
    return None


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(STATIC_PREFIX)


def cookie_header(name: str, value: str, *, secure: bool, max_age: int | None = None) -> str:
    parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if secure:
        parts.append("Secure")
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    return "; ".join(parts)


def is_https(scope: Scope) -> bool:
    return scope.get("scheme") == "https" or _header(scope, b"x-forwarded-proto") == "https"


def safe_next(target: str) -> str:
    """A local path to return to after login, never another site (``//evil``, ``https://``)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


class SecurityMiddleware:
    """Admin token check, the origin check, the CSRF cookie and token, and the security
    headers (pure ASGI, so that server-sent event streams pass through unbuffered)."""

    def __init__(
        self, app: ASGIApp, *, admin_token: str, session_seconds: float, allowed_hosts: tuple[str, ...] = ()
    ) -> None:
        self.app = app
        self.admin_token = admin_token
        self.session_seconds = session_seconds
        self.allowed_hosts = frozenset(host.strip().lower() for host in allowed_hosts if host.strip())
        self.csrf_key = csrf_key(admin_token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cookies = _cookies(scope)
        browser = cookies.get(CSRF_COOKIE, "")
        fresh = ""
        if len(browser) < 32:  # none yet (or mangled): give this browser one
            browser = fresh = secrets.token_urlsafe(32)
        token = form_token(self.csrf_key, browser, cookies.get(SESSION_COOKIE, ""))
        scope.setdefault("state", {})["csrf_token"] = token
        secure = is_https(scope)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
                headers.setdefault("cache-control", "no-store")
                if fresh:
                    headers.append("set-cookie", cookie_header(CSRF_COOKIE, fresh, secure=secure))
            await send(message)

        if not self.admin_token and not host_allowed(scope, self.allowed_hosts):
            await _plain(send_with_headers, 400, _WRONG_HOST)
            return
        path: str = scope.get("path", "")
        if not is_public(path) and not authenticated(scope, self.admin_token, self.session_seconds):
            if _bearer(scope) is not None:  # a wrong token: a guess, answered slowly
                await asyncio.sleep(WRONG_TOKEN_DELAY)
            await self._refuse(scope, send_with_headers)
            return
        if scope.get("method", "GET") not in SAFE_METHODS and not self._bearer_holder(scope):
            refusal = cross_origin_refusal(scope)
            if refusal is not None:
                _log.warning("console.cross_origin_refused", path=path, method=scope.get("method"), reason=refusal)
                await _plain(send_with_headers, 403, f"403 Forbidden: {refusal}\n".encode())
                return
        await self.app(scope, receive, send_with_headers)

    def _bearer_holder(self, scope: Scope) -> bool:
        """The request carries the admin token as bearer header (a script, never a page)."""
        bearer = _bearer(scope)
        return bool(self.admin_token) and bearer is not None and token_matches(bearer, self.admin_token)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        """A browser asking for a page goes to the login form; anything else gets 401."""
        wants_page = scope.get("method") == "GET" and "text/html" in _header(scope, b"accept")
        if wants_page:
            target = scope.get("path", "/")
            if scope.get("query_string"):
                target += "?" + scope["query_string"].decode("latin-1")
            headers = [(b"location", f"/login?next={quote(target, safe='')}".encode("latin-1"))]
            await send({"type": "http.response.start", "status": 303, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b"401 Unauthorized: log in at /login, or send Authorization: Bearer <KENNING_ADMIN_TOKEN>\n"
        await _plain(send, 401, body, [(b"www-authenticate", b'Bearer realm="kenning console"')])


_WRONG_HOST = (
    b"400 Bad Request: this console has no admin token, so it answers only to localhost, 127.0.0.1, [::1] "
    b"and --console-allowed-hosts (KENNING_CONSOLE_ALLOWED_HOSTS)\n"
)


async def _plain(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    start_headers = [(b"content-type", b"text/plain; charset=utf-8"), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": start_headers})
    await send({"type": "http.response.body", "body": body})


MAX_FORM_BYTES = 4_000_000  # a start's JSON input or an event's data, with room to spare


async def read_form(request: Request) -> FormData:
    """The POSTed ``application/x-www-form-urlencoded`` form (every console form is one):
    parsed here because Starlette's ``request.form()`` needs python-multipart, which
    Kenning does not depend on for forms without files."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise HTTPException(413, f"the form is over {MAX_FORM_BYTES} bytes")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if size and content_type != "application/x-www-form-urlencoded":  # an empty POST (curl -X POST) has none
        raise HTTPException(415, "the console's forms are sent as application/x-www-form-urlencoded")
    try:
        pairs: list[tuple[str, str | UploadFile]] = list(
            parse_qsl(b"".join(chunks).decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        )
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, "the form is not valid UTF-8 form data") from None
    return FormData(pairs)


def csrf_token(request: Request) -> str:
    """The token this browser's forms must carry (also in templates as ``csrf_token``),
    made by the middleware from this request's cookies."""
    return str(request.scope.get("state", {}).get("csrf_token", ""))


async def require_csrf(request: Request) -> FormData:
    """The POSTed form, if it carries this browser's CSRF token; else 403.

    A request with the admin token as bearer header needs none: no browser sends that
    header by itself, so no other site can make one."""
    form = await read_form(request)
    console_token = request.app.state.console.settings.admin_token
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if console_token and scheme.lower() == "bearer" and token_matches(presented.strip(), console_token):
        return form
    sent = form.get(CSRF_FIELD)
    expected = csrf_token(request)
    if not isinstance(sent, str) or not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise HTTPException(403, "the form's security token is missing or stale: reload the page and try again")
    return form
