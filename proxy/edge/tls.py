"""HTTPS and WSS on `server.bind`: Twisted's TLS layer under the node's front door.

The listening factory is Twisted's `TLSMemoryBIOFactory` wrapping the front door's factory, so
every front-door rule (head and body deadlines, per-address caps, the gate) sees the decrypted
stream exactly as it sees plain HTTP. Each new connection takes the context current at accept
time; `ServerTLS.reload` (SIGHUP) builds a new one from the files on disk, and connections made
before it keep theirs until they close.

With `server.tls_client_ca_file` the handshake asks for a client certificate without requiring
one (client paths take none), and refuses one that the CA did not sign. Whether a verified
certificate came with a connection is told to the app in the ASGI scope under
`CLIENT_CERT_SCOPE_KEY`, and node routes require it (the front door and the app both check).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from OpenSSL import SSL
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from zope.interface import implementer

from proxy.edge.gate import Refusal

logger = logging.getLogger("router")

# Set on every HTTP and WebSocket scope: True when the connection presented a client
# certificate that `server.tls_client_ca_file` signed (the handshake refuses any other).
CLIENT_CERT_SCOPE_KEY = "router.tls_client_cert"
# The session cache must be bound to this server's verification settings, or OpenSSL refuses
# resumed sessions once client certificates are requested.
SESSION_ID_CONTEXT = b"router-node"


def _verify(_conn: Any, _cert: Any, _errno: int, _depth: int, ok: int) -> bool:
    # OpenSSL's own chain check decides; a certificate from another CA ends the handshake.
    return bool(ok)


def build_context(cert_file: Path, key_file: Path, client_ca_file: Path | None) -> SSL.Context:
    """A server context for these files; raises `SSL.Error` or `OSError` when they do not do."""
    context = SSL.Context(SSL.TLS_SERVER_METHOD)
    context.set_min_proto_version(SSL.TLS1_2_VERSION)
    context.set_options(SSL.OP_NO_COMPRESSION | SSL.OP_CIPHER_SERVER_PREFERENCE)
    context.use_certificate_chain_file(str(cert_file))
    context.use_privatekey_file(str(key_file))
    context.check_privatekey()
    context.set_session_id(SESSION_ID_CONTEXT)
    if client_ca_file is not None:
        context.load_verify_locations(str(client_ca_file))
        context.load_client_ca(str(client_ca_file).encode())
        # VERIFY_PEER without FAIL_IF_NO_PEER_CERT: asked for, optional, checked if given.
        context.set_verify(SSL.VERIFY_PEER, _verify)
    return context


@implementer(IOpenSSLServerConnectionCreator)
class ServerTLS:
    """The node's TLS settings: the files of `server.*`, and the context new connections use."""

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self.context = build_context(cert_file, key_file, client_ca_file)

    @classmethod
    def from_config(cls, server: Any) -> ServerTLS | None:
        if server.tls_cert_file is None or server.tls_key_file is None:
            return None
        return cls(server.tls_cert_file, server.tls_key_file, server.tls_client_ca_file)

    @property
    def requires_client_cert(self) -> bool:
        return self.client_ca_file is not None

    def serverConnectionForTLS(self, protocol: Any) -> SSL.Connection:
        return SSL.Connection(self.context, None)

    def reload(self) -> bool:
        """Re-read the files; on failure keep serving the old ones. True when reloaded."""
        try:
            context = build_context(self.cert_file, self.key_file, self.client_ca_file)
        except (SSL.Error, OSError) as exc:
            logger.error(
                "TLS reload failed, still serving the previous certificate: %s",
                _reason(exc),
            )
            return False
        self.context = context
        logger.info("TLS certificate reloaded from %s", self.cert_file)
        return True

    def wrap(self, factory: Any) -> TLSMemoryBIOFactory:
        wrapped = TLSMemoryBIOFactory(self, False, factory)  # type: ignore[arg-type]
        # Twisted's default holds small writes for one more loop turn to batch them; measured
        # here (bench/tls.py) that turn is most of what TLS adds to a small answer, and a
        # stream's chunks are written as they come over plain HTTP too.
        wrapped.protocol = TLSMemoryBIOProtocol
        return wrapped


def _reason(exc: BaseException) -> str:
    if isinstance(exc, SSL.Error) and exc.args and isinstance(exc.args[0], list):
        return "; ".join(str(part[-1]) for part in exc.args[0]) or "unknown TLS error"
    return str(exc)


def is_tls(transport: Any) -> bool:
    return isinstance(transport, TLSMemoryBIOProtocol)


def has_client_cert(transport: Any) -> bool:
    """True when the connection presented a client certificate the handshake verified."""
    if not is_tls(transport):
        return False
    try:
        return transport.getPeerCertificate() is not None
    except SSL.Error:
        return False


def client_cert_refusal() -> Refusal:
    return Refusal(
        403,
        "node routes need a client certificate signed by server.tls_client_ca_file",
        type="forbidden",
        code="client_certificate_required",
    )
