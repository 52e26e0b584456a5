"""HTTPS and WSS on `server.bind`: the standard library's TLS under the node's asyncio server.

The server hands `ServerTLS.context` to `loop.create_server(ssl=...)` once, when it starts
listening. Each new connection is wrapped by the context current at accept time;
`ServerTLS.reload` (SIGHUP) builds a new one from the files on disk, and connections made
before it keep theirs until they close.

With `server.tls_client_ca_file` the handshake asks for a client certificate without requiring
one (client paths take none), and refuses one that the CA did not sign. Whether a verified
certificate came with a connection is told to the app in the ASGI scope under
`CLIENT_CERT_SCOPE_KEY`, and node routes require it (the front door and the app both check).
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from pathlib import Path
from typing import Any, Protocol

from proxy.edge.gate import Refusal

logger = logging.getLogger("router")

# Set on every HTTP and WebSocket scope: True when the connection presented a client
# certificate that `server.tls_client_ca_file` signed (the handshake refuses any other).
CLIENT_CERT_SCOPE_KEY = "router.tls_client_cert"

# OpenSSL's text is "[LIBRARY: CODE] reason (_ssl.c:LINE)"; the reason alone is what an
# operator can act on.
_SSL_TEXT = re.compile(r"^\[[^\]]*\]\s*(?P<reason>.*?)(?:\s*\(_ssl\.c:\d+\))?$")


class ServerFiles(Protocol):
    """The keys of `server` this module reads."""

    tls_cert_file: Path | None
    tls_key_file: Path | None
    tls_client_ca_file: Path | None


def build_context(cert_file: Path, key_file: Path, client_ca_file: Path | None) -> ssl.SSLContext:
    """A server context for these files; raises `ssl.SSLError` or `OSError` when they do not do
    (a key that is not the certificate's included)."""
    for path in (cert_file, key_file, client_ca_file):
        if path is not None:
            # OpenSSL's errors name no file: opening each first makes a missing or unreadable
            # one an OSError that says which.
            with path.open("rb"):
                pass
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        exc.add_note(f"{cert_file} with {key_file}")
        raise
    if client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=client_ca_file)
        except ssl.SSLError as exc:
            exc.add_note(str(client_ca_file))
            raise
        # Asked for, optional, checked if given: client paths take no certificate, and one
        # from another CA ends the handshake.
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


class _CurrentContext(ssl.SSLContext):
    """The listening context: it holds no certificate of its own and wraps each new connection
    with `current`.

    asyncio and uvloop fix the context at `create_server` and make each connection's TLS object
    with its `wrap_bio`, so delegating that call is what puts every new connection on the
    context of the latest reload: certificate, client CA, session cache and session-ticket keys
    alike, as a context per connection did under Twisted.

    Swapping `ssl_object.context` from an `sni_callback` is not enough, although the callback
    does run for clients that send no SNI (a client of 127.0.0.1): it swaps the certificate and
    the CA store but not the sessions, which stay the listening context's. A client resuming a
    session from before a reload was still shown the old certificate, and a client certificate
    verified under the old CA came back with its session (proxy/tests/test_tls.py checks both).
    Were connections ever wrapped another way, they would meet this empty context and fail
    their handshake rather than be served a stale certificate.
    """

    current: ssl.SSLContext

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return self.current.wrap_bio(incoming, outgoing, server_side, server_hostname, session)


class ServerTLS:
    """The node's TLS settings: the files of `server.*`, and the context new connections use."""

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self._listening = _CurrentContext(ssl.PROTOCOL_TLS_SERVER)
        self._listening.current = build_context(cert_file, key_file, client_ca_file)

    @classmethod
    def from_config(cls, server: ServerFiles) -> ServerTLS | None:
        if server.tls_cert_file is None or server.tls_key_file is None:
            return None
        return cls(server.tls_cert_file, server.tls_key_file, server.tls_client_ca_file)

    @property
    def requires_client_cert(self) -> bool:
        return self.client_ca_file is not None

    @property
    def context(self) -> ssl.SSLContext:
        """For `loop.create_server(ssl=...)`, once: it stays the same object across reloads."""
        return self._listening

    def reload(self) -> bool:
        """Re-read the files; on failure keep serving the old ones. True when reloaded."""
        try:
            context = build_context(self.cert_file, self.key_file, self.client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            logger.error(
                "TLS reload failed, still serving the previous certificate: %s",
                _reason(exc),
            )
            return False
        self._listening.current = context
        logger.info("TLS certificate reloaded from %s", self.cert_file)
        return True


def _reason(exc: BaseException) -> str:
    """One line for a log: what failed, and in which files when known."""
    if isinstance(exc, ssl.SSLError):
        text = exc.strerror if isinstance(exc.strerror, str) else str(exc)
        match = _SSL_TEXT.match(text)
        text = match["reason"] if match and match["reason"] else text
        if text == "PEM lib":
            # OpenSSL's whole account of a file holding no PEM block of the kind it wanted.
            text = "not a PEM certificate and key"
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc)
    where = "; ".join(getattr(exc, "__notes__", ()))
    return f"{where}: {text}" if where else text


def _extra(transport: asyncio.BaseTransport | None, name: str) -> Any:
    # None before a connection is made; a transport without extra info (a test's) is not TLS.
    get = getattr(transport, "get_extra_info", None)
    return None if get is None else get(name)


def is_tls(transport: asyncio.BaseTransport | None) -> bool:
    return _extra(transport, "ssl_object") is not None


def has_client_cert(transport: asyncio.BaseTransport | None) -> bool:
    """True when the connection presented a client certificate the handshake verified."""
    # `getpeercert()` is None without a certificate and a non-empty dict only once verified;
    # asyncio and uvloop keep it after the transport closes.
    return bool(_extra(transport, "peercert"))


def client_cert_refusal() -> Refusal:
    return Refusal(
        403,
        "node routes need a client certificate signed by server.tls_client_ca_file",
        type="forbidden",
        code="client_certificate_required",
    )
