"""The TLS keys of the config (certificate, key and CA files, checked at start) and the
cluster's older tokens.

A node must not start with a pair that cannot serve (a key of another certificate, a file it
cannot read): the problem is reported on the key, the way every other config error is, rather
than as a handshake failure on the first connection.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationInfo

from routerproject.config.values import base_dir_of, require_str, resolve_path


def _validate_file(value: Any, info: ValidationInfo) -> Path | None:
    if value is None:
        return None
    text = str(value) if isinstance(value, Path) else require_str(value).strip()
    if not text:
        return None
    path = resolve_path(text, base_dir_of(info))
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise ValueError(f"cannot be read: {exc.strerror or exc}") from None
    return path


# A PEM file that must exist and be readable; empty means unset.
OptionalFile = Annotated[Path | None, BeforeValidator(_validate_file)]


def _pair_problems(
    cert_key: str, cert: Path | None, key_key: str, key: Path | None
) -> list[tuple[str, str]]:
    """Both files or neither, and the key must be the certificate's."""
    if cert is None and key is None:
        return []
    if key is None:
        return [(key_key, f"is required with {cert_key}")]
    if cert is None:
        return [(cert_key, f"is required with {key_key}")]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            return [(key_key, f"does not match the certificate in {cert_key}")]
        try:
            context.load_verify_locations(cafile=str(cert))
        except ssl.SSLError:
            return [(cert_key, "is not a PEM certificate")]
        return [(key_key, f"is not a PEM private key for {cert_key}")]
    return []


def _ca_problems(name: str, path: Path | None) -> list[tuple[str, str]]:
    if path is None:
        return []
    try:
        ssl.create_default_context(cafile=str(path))
    except ssl.SSLError:
        return [(name, "holds no PEM CA certificate")]
    return []


def _previous_token_problems(auth: Any, cluster: Any) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for index, old in enumerate(cluster.previous_tokens):
        key = f"cluster.previous_tokens[{index}]"
        if not old:
            problems.append((key, "must not be empty"))
        elif auth is not None and (old in auth.inference_keys or old in auth.admin_keys):
            # Never echo the value: it is a secret.
            problems.append((key, "must not reuse a value from auth"))
    return problems


def tls_problems(server: Any, auth: Any, cluster: Any) -> list[tuple[str, str]]:
    """Cross-key rules of the TLS keys and of `cluster.previous_tokens`, over whichever
    sections validated on their own."""
    problems: list[tuple[str, str]] = []
    if server is not None:
        problems += _pair_problems(
            "server.tls_cert_file",
            server.tls_cert_file,
            "server.tls_key_file",
            server.tls_key_file,
        )
        if server.tls_client_ca_file is not None and server.tls_cert_file is None:
            problems.append(
                ("server.tls_client_ca_file", "needs server.tls_cert_file and tls_key_file")
            )
        problems += _ca_problems("server.tls_client_ca_file", server.tls_client_ca_file)
    if cluster is not None:
        problems += _previous_token_problems(auth, cluster)
        problems += _ca_problems("cluster.tls_ca_file", cluster.tls_ca_file)
        problems += _pair_problems(
            "cluster.tls_client_cert_file",
            cluster.tls_client_cert_file,
            "cluster.tls_client_key_file",
            cluster.tls_client_key_file,
        )
    return problems
