"""What a node trusts and shows when it calls other nodes at `https://` URLs.

`cluster.tls_ca_file` replaces the system's store for node URLs (a private CA then vouches
for nodes and nothing else does); hostnames and IP addresses in the URL are checked against
the certificate either way. `cluster.tls_client_cert_file` / `tls_client_key_file` are shown
to nodes that ask for a client certificate (`server.tls_client_ca_file` on their side).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from registry.hashing import resolve_model_path


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


def ca_file_problem(path: Path) -> str | None:
    """Why `path` cannot serve as a CA bundle, or None when it can."""
    try:
        ssl.create_default_context(cafile=str(path))
    except ssl.SSLError:
        # An OSError too: caught first.
        return "holds no PEM CA certificate"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return None


def upstream_ca_file(
    raw: Mapping[str, Any], base_dir: Path, backend_mode: str
) -> tuple[Path | None, str | None]:
    """A model config's `upstream_tls_ca_file`, checked when the config is read (a wrong one is
    that config's error, not every request's): the path, or why it cannot serve."""
    value = raw.get("upstream_tls_ca_file")
    if value is None:
        return None, None
    if backend_mode != "upstream":
        return None, "is only allowed with backend_mode upstream"
    if not isinstance(value, str) or not value:
        return None, "must be a file path"
    path = resolve_model_path(value, base_dir=base_dir)
    problem = ca_file_problem(path)
    return (None, problem) if problem else (path, None)


_BY_CA_FILE: dict[str, ssl.SSLContext] = {}


def ca_ssl_context(ca_file: Any) -> ssl.SSLContext | bool:
    """What an `https://` backend is verified against: only `ca_file` (an upstream's own CA,
    one context per file, kept for the pool to reuse), or the system's store when None."""
    if ca_file is None:
        return True
    key = str(ca_file)
    context = _BY_CA_FILE.get(key)
    if context is None:
        context = _BY_CA_FILE[key] = ssl.create_default_context(cafile=key)
    return context
