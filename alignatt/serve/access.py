"""Who may connect: the Origin allow-list, the shared token, TLS, and the start-up exposure check.

Everything here is decided at the WebSocket handshake, before a connection exists: a refused
client never reaches `Connection`, so it takes no session slot and no place among the
connections waiting for `init`. The Origin check is websockets' own (`origins=` of `serve`,
`None` = no Origin header: WhisperLiveKit's client and the project's send none, browsers always
do); the token is checked in `process_request`, in constant time. A token never reaches a log:
the library's wire logger is kept at WARNING (at DEBUG it writes request lines and headers), and
paths are logged without their query.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import ssl
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from alignatt.core.errors import AlignattError
from alignatt.serve.config import ServerConfig

TOKEN_ENV = "ALIGNATT_TOKEN"  # what `alignatt serve` reads (ServerConfig.token_env)


def load_token(config: ServerConfig) -> str | None:
    """The shared secret: `token_file`'s content, else the variable `token_env` names, else None."""
    if config.token_file:
        try:
            token = Path(config.token_file).read_text().strip()
        except OSError as e:
            raise AlignattError(f"cannot read token file {config.token_file}: {e.strerror}") from None
        if not token:
            raise AlignattError(f"token file {config.token_file} is empty")
        return token
    if not config.token_env:
        return None
    return os.environ.get(config.token_env, "").strip() or None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost, or "" (every interface)
        return False


def check_exposure(config: ServerConfig) -> str | None:
    """The token, after refusing a server that would listen beyond loopback without one (unless
    `insecure_no_token`). Called before any model is loaded, so the refusal is immediate."""
    token = load_token(config)
    if token is None and not is_loopback(config.host) and not config.insecure_no_token:
        raise AlignattError(f"refusing to listen on {config.host} without a token: give --token-file or "
                            f"${config.token_env or TOKEN_ENV}, or --insecure-no-token")
    return token


def ssl_context(config: ServerConfig) -> ssl.SSLContext | None:
    """A server TLS context from `ssl_certfile` / `ssl_keyfile` (None: plain ws://)."""
    if not config.ssl_certfile and not config.ssl_keyfile:
        return None
    if not config.ssl_certfile:
        raise AlignattError("--ssl-keyfile needs --ssl-certfile")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile or None)
    except (OSError, ssl.SSLError) as e:
        raise AlignattError(f"cannot load TLS certificate {config.ssl_certfile}: {e}") from None
    # No TLS 1.3 session tickets: they arrive after the handshake, while a threaded client (websockets'
    # sync client reads on one thread and writes its opening request on another, on one SSL socket)
    # is sending, and about one connection in a hundred (TLS, on this machine) never got its request through.
    # A session is one long connection: resuming its TLS session would save nothing.
    context.num_tickets = 0
    return context


def allowed_origins(config: ServerConfig) -> list[str | None]:
    """websockets' `origins=`: no Origin header, plus the operator's allow-list."""
    return [None, *config.allow_origins]


def path_of(request_path: str) -> str:
    """The request path without its query (what may be logged: the query may hold a token)."""
    return urlsplit(request_path).path


def presented_token(request) -> str | None:
    """The token a handshake request carries: `Authorization: Bearer ...`, else `?token=`."""
    auth = request.headers.get("Authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    values = parse_qs(urlsplit(request.path).query).get("token")
    return values[0] if values else None


def token_matches(expected: str, presented: str | None) -> bool:
    """Constant time in the content (a wrong token of the right length costs what a right one does)."""
    if presented is None:
        return False
    return hmac.compare_digest(expected.encode("utf-8"), presented.encode("utf-8", "surrogatepass"))


class OncePerPeer:
    """Which peers a refusal was already logged for (bounded: past `limit` it starts afresh)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self.seen: set[tuple[str, str]] = set()

    def first(self, kind: str, peer: str) -> bool:
        key = (kind, peer)
        if key in self.seen:
            return False
        if len(self.seen) >= self.limit:
            self.seen.clear()
        self.seen.add(key)
        return True
