"""The node's front-door rules, decided from a request's head alone (method, path, headers, peer).

One place says who may send what, so the protocol-level front door (`proxy.edge.frontdoor`, which
answers before a byte of the body is read) and the ASGI app (the second guard) refuse alike:

- `server.allowed_cidrs`: the client's address (the TCP peer, or the `X-Forwarded-For` hop a
  `server.trusted_proxies` peer vouches for) must be in one of the networks: 403 on every path.
- keys: node routes need the cluster token, client routes an inference key, management routes
  an admin key, with the status and envelope the app answers. A key is one of the config
  file's (`auth.inference_keys`, `auth.admin_keys`) or a stored key the node's table holds
  (`access.keys`): client paths need one when either kind exists, management routes when a
  config admin key or a stored admin key exists (README, "Giving people keys").
- browsers (DNS rebinding, cross-site requests): what a browser reaches (management
  API, WebUI, admin) answers only under `server.allowed_hosts`; management writes need a JSON
  body and, on a node without admin keys, the same origin as the page.
- `server.max_body_bytes`: a declared length above it gets 413 before the body is read.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from access.identity import MASTER, Caller
from access.keys import KeyTable, admin_caller, client_caller, current_table
from proxy.edge.nodeapi import NODE_PREFIX
from proxy.edge.routes import route_for
from proxy.edge.selfcheck import HEALTHCHECK_HEADER, HEALTHCHECK_PATHS, healthcheck_credential
from routerproject.api import (
    MANAGEMENT_PREFIX,
    WRITE_METHODS,
    admin_key_required,
)
from routerproject.errors import RouterError, error_body

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
HeaderLookup = Callable[[bytes], bytes | None]

JSON_TYPES = ("application/json",)
# What a node route with the cluster token is: the master (or a peer) acting for the cluster.
MASTER_CALLER = Caller(kind=MASTER)


@dataclass(frozen=True)
class Refusal:
    """An answer decided before the request reaches the app."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()

    def error(self) -> RouterError:
        return RouterError(
            self.status, self.message, type=self.type, code=self.code, param=self.param
        )

    def body(self, path: str) -> bytes:
        return error_body(path, self.error())


# Distinct addresses a process keeps parsed: a node hears from few clients, and a flood of new
# ones only evicts the oldest.
PARSED_ADDRESSES_KEPT = 4096


def parse_address(text: str | bytes | None) -> Address | None:
    # Every request's peer is parsed again (ipaddress takes a few microseconds for it), and
    # addresses are immutable: each distinct text is parsed once.
    return None if text is None else _parse_address(text)


@functools.lru_cache(maxsize=PARSED_ADDRESSES_KEPT)
def _parse_address(text: str | bytes) -> Address | None:
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            return None
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # A dual-stack socket reports IPv4 clients as ::ffff:a.b.c.d; the operator wrote a.b.c.d.
        return address.ipv4_mapped
    return address


def _in(address: Address, networks: Sequence[Network]) -> bool:
    return any(address.version == net.version and address in net for net in networks)


def host_name(host: bytes | None) -> str | None:
    """The lower-case name of a `Host` header (`example.com:8080`, `[::1]:8080`), no port."""
    if not host:
        return None
    try:
        text = host.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return ""
    if text.startswith("["):
        end = text.find("]")
        return text[1:end] if end > 0 else ""
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def bearer_token(header: bytes | None) -> bytes:
    """The key of an `Authorization: Bearer <key>` header (empty without one)."""
    header = header or b""
    return header[7:].strip() if header.startswith(b"Bearer ") else b""


# A browser cannot set headers on a WebSocket: OpenAI's browser SDK sends the key as a
# subprotocol instead (`/v1/realtime`).
KEY_SUBPROTOCOL_PREFIX = b"openai-insecure-api-key."


def inference_token(header: HeaderLookup) -> bytes:
    """The inference key a request carries: its Bearer header, an `x-api-key` header (the
    Anthropic SDK's, on `/v1/messages`), or the key subprotocol of a WebSocket upgrade."""
    token = bearer_token(header(b"authorization"))
    if token:
        return token
    api_key = (header(b"x-api-key") or b"").strip()
    if api_key:
        return api_key
    for offered in (header(b"sec-websocket-protocol") or b"").split(b","):
        offered = offered.strip()
        if offered.startswith(KEY_SUBPROTOCOL_PREFIX):
            return offered[len(KEY_SUBPROTOCOL_PREFIX) :]
    return b""


class Gate:
    """The rules of one node's config, with its networks and keys parsed once."""

    def __init__(
        self,
        config: Any,
        *,
        browser_hosts: Sequence[str] | None = (),
        keys: Callable[[], KeyTable] = current_table,
    ) -> None:
        """`browser_hosts`, when given (None: any host), replaces the config's list; `keys`
        gives the stored-key table in force (the process's, by default)."""
        self.config = config
        server = config.server
        self.allowed: tuple[Network, ...] = server.allowed_networks
        self.proxies: tuple[Network, ...] = server.proxy_networks
        self.browser_hosts: tuple[str, ...] | None
        if browser_hosts == ():
            self.browser_hosts = server.browser_hosts(config.cluster.public_url)
        else:
            self.browser_hosts = None if browser_hosts is None else tuple(browser_hosts)
        self.limit: int = server.max_body_bytes
        self.inference_keys: tuple[bytes, ...] = tuple(
            key.encode() for key in config.auth.inference_keys
        )
        self.admin_keys: list[str] = list(config.auth.admin_keys)
        self.admin_key_bytes: tuple[bytes, ...] = tuple(key.encode() for key in self.admin_keys)
        self.keys = keys
        self.token: bytes = config.cluster.token.encode()
        # The current token and the older ones still accepted while a new one rolls out.
        self.accepted_tokens: tuple[bytes, ...] = tuple(
            token.encode() for token in (config.cluster.token, *config.cluster.previous_tokens)
        )
        self.standalone: bool = config.cluster.role == "standalone"
        self.healthcheck: bytes = healthcheck_credential().encode()

    # -- addresses -----------------------------------------------------------------------------

    def is_trusted_proxy(self, peer: Address | None) -> bool:
        return peer is not None and _in(peer, self.proxies)

    def client_address(self, peer: Address | None, header: HeaderLookup) -> Address | None:
        """The client's address: the peer, or the nearest untrusted `X-Forwarded-For` hop when
        the peer is a trusted proxy. `None` when a trusted proxy forwarded a hop that is no
        address (it cannot be placed in any network)."""
        if peer is None or not self.is_trusted_proxy(peer):
            return peer
        forwarded = header(b"x-forwarded-for")
        if not forwarded:
            return peer
        hops = [part.strip() for part in forwarded.split(b",")]
        address = peer
        # Walk from the nearest hop: each trusted proxy vouches for the hop before it.
        for hop in reversed(hops):
            if not _in(address, self.proxies):
                break
            parsed = parse_address(hop)
            if parsed is None:
                return None
            address = parsed
        return address

    def address_refusal(
        self, peer: Address | None, header: HeaderLookup, path: str = ""
    ) -> Refusal | None:
        if not self.allowed or self._own_healthcheck(peer, header, path):
            return None
        client = self.client_address(peer, header)
        if client is not None and _in(client, self.allowed):
            return None
        shown = str(client) if client is not None else "unknown"
        return Refusal(
            403,
            f"client address {shown} is not in server.allowed_cidrs",
            type="forbidden",
            code="address_not_allowed",
        )

    def _own_healthcheck(self, peer: Address | None, header: HeaderLookup, path: str) -> bool:
        """The node's own health check (proxy.edge.selfcheck): its health routes, from the TCP
        peer on loopback (never a forwarded address), with the credential of its secret key."""
        return (
            path in HEALTHCHECK_PATHS
            and peer is not None
            and peer.is_loopback
            and hmac.compare_digest(header(HEALTHCHECK_HEADER) or b"", self.healthcheck)
        )

    # -- browsers ------------------------------------------------------------------------------

    def host_refusal(self, path: str, header: HeaderLookup) -> Refusal | None:
        """`server.allowed_hosts`, for what a browser reaches (not inference or node routes)."""
        if (
            self.browser_hosts is None
            or route_for(path) is not None
            or path.startswith(NODE_PREFIX)
        ):
            return None
        host_header = header(b"host")
        if host_header is None:
            return None
        name = host_name(host_header)
        if name in self.browser_hosts:
            return None
        return Refusal(
            400,
            f"host {str(name)[:100]!r} is not in server.allowed_hosts",
            code="host_not_allowed",
            param="Host",
        )

    def write_refusal(self, method: str, path: str, header: HeaderLookup) -> Refusal | None:
        """Management writes: a JSON body, and the page's own origin when there is no admin key."""
        if (
            method not in WRITE_METHODS
            or not path.startswith(MANAGEMENT_PREFIX)
            or path.startswith(NODE_PREFIX)
        ):
            return None
        host_header = header(b"host")
        content_type = header(b"content-type")
        length = header(b"content-length") or b"0"
        has_body = bool(header(b"transfer-encoding")) or length not in (b"0", b"")
        if has_body:
            media = (content_type or b"").split(b";", 1)[0].strip().lower()
            if media.decode("latin-1") not in JSON_TYPES and not media.endswith(b"+json"):
                return Refusal(
                    415,
                    "a management write needs Content-Type: application/json",
                    code="unsupported_media_type",
                    param="Content-Type",
                )
        if not self.admin_keys_required():
            return self._origin_refusal(header, host_header)
        return None

    @staticmethod
    def _origin_refusal(header: HeaderLookup, host_header: bytes | None) -> Refusal | None:
        # Without an admin key any page the operator opens could write here: a write must come
        # from this node's own pages (or from a client that is no browser and sends no origin).
        source = header(b"origin")
        which = "Origin"
        if source is None:
            source = header(b"referer")
            which = "Referer"
        if source is None:
            return None
        try:
            netloc = urlsplit(source.decode("ascii")).netloc.lower()
        except (UnicodeDecodeError, ValueError):
            netloc = ""
        own = (host_header or b"").decode("latin-1").strip().lower()
        if netloc and own and netloc == own:
            return None
        return Refusal(
            403,
            "cross-origin write refused: this node has no admin key, so management writes must "
            "come from its own pages",
            type="forbidden",
            code="cross_origin",
            param=which,
        )

    # -- keys and size ---------------------------------------------------------------------------

    def client_caller(self, header: HeaderLookup) -> Caller | None:
        """Who a client request's key says it is; None: refuse it (401)."""
        return client_caller(inference_token(header), self.inference_keys, self.keys())

    def admin_caller(self, header: HeaderLookup) -> Caller | None:
        """Who a management request's Bearer key says it is; None: it carries no admin key
        where one is required."""
        return admin_caller(
            bearer_token(header(b"authorization")), self.admin_key_bytes, self.keys()
        )

    def admin_keys_required(self) -> bool:
        return bool(self.admin_keys) or self.keys().admin_required

    def key_refusal(self, method: str, path: str, header: HeaderLookup) -> Refusal | None:
        """The key rules of `proxy.edge.app.ProxyApp`, in its order (node token, method, key)."""
        route = route_for(path)
        if route is None:
            if path.startswith(NODE_PREFIX):
                return self._node_refusal(header)
            if admin_key_required(path, method) and self.admin_caller(header) is None:
                return Refusal(401, "a valid admin key is required", type="unauthorized")
            return None
        methods, _handler, needs_key = route
        if method not in methods:
            allow = ", ".join(sorted(methods)).encode()
            return Refusal(
                405, f"method {method} is not allowed on {path}", headers=((b"allow", allow),)
            )
        if needs_key and self.client_caller(header) is None:
            return Refusal(401, "a valid inference key is required", type="unauthorized")
        return None

    def _node_refusal(self, header: HeaderLookup) -> Refusal | None:
        if not self.token or self.standalone:
            return Refusal(401, "cluster token is required", type="unauthorized")
        given = bearer_token(header(b"authorization"))
        ok = False
        # Every accepted token is compared, so timing tells nothing about which one matched.
        for token in self.accepted_tokens:
            ok |= hmac.compare_digest(given, token)
        if not ok:
            return Refusal(401, "invalid cluster token", type="unauthorized")
        return None

    def too_large(self) -> Refusal:
        return Refusal(
            413,
            f"request body is larger than the limit of {self.limit} bytes",
            code="body_too_large",
        )

    def head_refusal(
        self, method: str, raw_path: bytes, header: HeaderLookup, peer: Address | None
    ) -> tuple[str, Refusal | None]:
        """Every rule that the head decides, in the order the app applies them.

        Returns the decoded path (for the error's format) and the refusal, if any.
        """
        try:
            path = unquote(raw_path.split(b"?", 1)[0].decode("ascii"))
        except UnicodeDecodeError:
            return "/", Refusal(400, "invalid characters in path")
        # The write rules after the keys: a caller without the key learns nothing more.
        refusal = (
            self.address_refusal(peer, header, path)
            or self.host_refusal(path, header)
            or self.key_refusal(method, path, header)
            or self.write_refusal(method, path, header)
        )
        if refusal is None:
            length = header(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.limit:
                refusal = self.too_large()
        return path, refusal
