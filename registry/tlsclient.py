"""What a node trusts and shows when it calls other nodes at `https://` URLs.

`cluster.tls_ca_file` replaces the system's store for node URLs (a private CA then vouches
for nodes and nothing else does); hostnames and IP addresses in the URL are checked against
the certificate either way. `cluster.tls_client_cert_file` / `tls_client_key_file` are shown
to nodes that ask for a client certificate (`server.tls_client_ca_file` on their side).
"""

from __future__ import annotations

import ssl
from typing import Any


def node_ssl_context(cluster: Any) -> ssl.SSLContext | None:
    """The context for calls to other nodes; None when the defaults do (no CA, no cert)."""
    ca_file = cluster.tls_ca_file
    cert_file = cluster.tls_client_cert_file
    if ca_file is None and cert_file is None:
        return None
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    if cert_file is not None:
        context.load_cert_chain(str(cert_file), str(cluster.tls_client_key_file))
    return context


def ca_ssl_context(ca_file: Any) -> ssl.SSLContext:
    """A verifying context that trusts only `ca_file` (an upstream backend's own CA)."""
    return ssl.create_default_context(cafile=str(ca_file))
