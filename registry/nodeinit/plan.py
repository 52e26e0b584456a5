"""What `init_node` decides before it writes: the node's name and address, its secrets, and a
check of the config text by the node's own loader."""

from __future__ import annotations

import re
import secrets
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from registry.nodeinit.render import MODELS_SUBDIR
from routerproject.config import load_config
from routerproject.config.values import split_bind

# Where a wildcard bind guesses the machine's address from: a documentation address
# (RFC 5737) is routed like any outside address, and connecting a UDP socket sends nothing.
_OUTSIDE_ADDRESS = "192.0.2.1"
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")
_NODE_ID_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")
SECRET_BYTES = 32


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def default_node_id(hostname: str | None = None) -> str:
    """The machine's short host name, in the characters a node ID may hold."""
    name = (hostname if hostname is not None else socket.gethostname()).split(".")[0]
    return _NODE_ID_UNSAFE_RE.sub("-", name).strip("-")[:64] or "node"


def _route_address(toward: str) -> str:
    """This machine's address on the route to `toward` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in toward else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((toward, 9))
            address: str = probe.getsockname()[0]
            return address
    except OSError:
        return socket.gethostname()


def default_public_url(bind: str, *, master_url: str = "") -> str:
    """How other machines reach this node: the bind host, or for a wildcard bind the address
    this machine uses toward its master (a slave) or toward the outside (a master)."""
    host, port = split_bind(bind)
    if host in _WILDCARD_HOSTS:
        master = urlsplit(master_url)
        host = _route_address(master.hostname or _OUTSIDE_ADDRESS)
    scheme = urlsplit(master_url).scheme if master_url else "http"
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def check_config(text: str, files: Mapping[str, str] | None = None) -> None:
    """Load `text` as the node would, beside its models dir and the `files` it names (file
    name to content); ConfigError names the key."""
    with tempfile.TemporaryDirectory(prefix="init-node-") as tmp:
        root = Path(tmp)
        (root / MODELS_SUBDIR).mkdir()
        for name, content in (files or {}).items():
            (root / name).write_text(content, encoding="utf-8")
        path = root / "config.yaml"
        path.write_text(text, encoding="utf-8")
        # No environment: the file must stand on its own (no token from $ROUTER_CLUSTER_TOKEN).
        load_config(path, environ={})
