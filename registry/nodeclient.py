"""The node-to-node HTTP client used for every call between nodes of a cluster.

One instance per process carries the cluster token. Because that token opens
every `/router/v1/node/*` route on every node, the client only talks to base
URLs on an allow-list, follows redirects only inside the allowed base, caps
bodies and bounds every exchange in time (reference-cluster.md §2.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import ssl
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

CONNECT_TIMEOUT_SECS = 5.0
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_REDIRECTS = 10
CHECKED_URL_CACHE_SIZE = 1024
# Node-to-node forwarding holds one connection per in-flight generation, so the
# pool has to be large enough for the cluster's concurrent streams.
POOL_MAX_CONNECTIONS = 100
POOL_MAX_KEEPALIVE_CONNECTIONS = 20
# Enough of an error body to make a log line useful without flooding it.
ERROR_PREVIEW_BYTES = 200

ERROR_KINDS = frozenset(
    {"not_allowed", "transport", "timeout", "status", "too_large", "invalid_json", "redirect"}
)
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
DEFAULT_PORTS = {"http": 80, "https": 443}
# Headers that describe one connection or one framing of the body; forwarding
# them from the incoming request would corrupt the outgoing one (a rewritten
# body has a different length) or leak a credential meant for a proxy.
HOP_BY_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

_HOSTNAME_RE = re.compile(r"^[a-z0-9_.-]+$")


class NodeCallError(Exception):
    """A node call that did not produce a usable answer; `kind` says why."""

    def __init__(
        self, kind: str, message: str, *, status: int | None = None, body: bytes = b""
    ) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown NodeCallError kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.body = body

    def __repr__(self) -> str:
        return (
            f"NodeCallError(kind={self.kind!r}, message={self.message!r}, status={self.status!r})"
        )


def _split_url(url: str) -> tuple[str, str]:
    """Return (normalized origin, raw path) or raise ValueError.

    Origin and path are kept apart so that prefix checks can never match
    across the origin boundary (`http://a` must not allow `http://ab`).
    """
    if not isinstance(url, str):
        raise ValueError("URL must be a string")
    url = url.strip()
    # urlsplit silently drops tabs and newlines, so a URL that contains them
    # would be checked in one form and sent in another.
    if not url.isascii() or any(ch.isspace() or not ch.isprintable() for ch in url):
        raise ValueError(f"URL contains whitespace, control or non-ASCII characters: {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"URL scheme must be http or https: {url!r}")
    if "@" in parts.netloc:
        raise ValueError(f"URL must not contain userinfo: {url!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"URL has no host: {url!r}")
    port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    if ":" in host:
        if "%" in host:
            raise ValueError(f"IPv6 zone identifiers are not supported: {url!r}")
        host_part = f"[{ipaddress.IPv6Address(host).compressed}]"
    elif _HOSTNAME_RE.match(host):
        host_part = host
    else:
        raise ValueError(f"URL host is not valid: {url!r}")
    if port is not None and port != DEFAULT_PORTS[scheme]:
        host_part = f"{host_part}:{port}"
    return f"{scheme}://{host_part}", parts.path


def _has_dot_segment(path: str) -> bool:
    # Checked on the decoded path because servers decode `%2e%2e` before
    # resolving it, and a `..` would let a textual prefix match escape the base.
    decoded = unquote(path).replace("\\", "/")
    return any(segment in (".", "..") for segment in decoded.split("/"))


def normalize_base_url(url: str) -> str:
    """Canonical form of a node base URL, used for every allow-list comparison."""
    origin, path = _split_url(url)
    if _has_dot_segment(path):
        raise ValueError(f"URL path must not contain dot segments: {url!r}")
    return origin + path.rstrip("/")


def _is_at_or_below(base: str, url: str) -> bool:
    """True when `url` is the normalized `base` or lies below it on a segment boundary."""
    try:
        base_origin, base_path = _split_url(base)
        origin, path = _split_url(url)
    except ValueError:
        return False
    if origin != base_origin or _has_dot_segment(path):
        return False
    base_path = base_path.rstrip("/")
    path = path.rstrip("/")
    if not path.startswith(base_path):
        return False
    return len(path) == len(base_path) or path[len(base_path)] == "/"


Index = dict[str, tuple[tuple[str, str], ...]]
"""origin → (base, base path without its trailing slash) of every allowed base there."""


def _index_add(index: Index, base: str) -> Index:
    origin, path = _split_url(base)
    out = dict(index)
    out[origin] = (*index.get(origin, ()), (base, path.rstrip("/")))
    return out


class AllowList:
    """The set of node base URLs this process may send the cluster token to.

    Reads happen on every call while writes are rare (a slave registering), so
    the set is replaced rather than mutated and readers never need the lock.
    The bases are indexed by origin: a call looks at the bases of its own origin only, where
    a scan of every base cost a thousand URL parses a call on a master of a thousand nodes.
    """

    def __init__(self, urls: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._bases: frozenset[str] = frozenset(normalize_base_url(url) for url in urls)
        index: Index = {}
        for base in self._bases:
            index = _index_add(index, base)
        self._by_origin = index

    def add(self, url: str) -> None:
        base = normalize_base_url(url)
        with self._lock:
            if base in self._bases:
                return
            self._by_origin = _index_add(self._by_origin, base)
            self._bases = self._bases | {base}

    def discard(self, url: str) -> None:
        try:
            base = normalize_base_url(url)
        except ValueError:
            return  # an invalid URL can never have been added
        with self._lock:
            if base not in self._bases:
                return
            origin, _ = _split_url(base)
            index = dict(self._by_origin)
            kept = tuple(entry for entry in index[origin] if entry[0] != base)
            if kept:
                index[origin] = kept
            else:
                del index[origin]
            self._bases = self._bases - {base}
            self._by_origin = index

    @property
    def bases(self) -> frozenset[str]:
        return self._bases

    def __contains__(self, url: object) -> bool:
        if not isinstance(url, str):
            return False
        try:
            return normalize_base_url(url) in self._bases
        except ValueError:
            return False

    def base_for(self, url: str) -> str | None:
        """The allowed base that `url` is at or below; the longest one if several match."""
        try:
            origin, path = _split_url(url)
        except ValueError:
            return None
        if _has_dot_segment(path):
            return None
        path = path.rstrip("/")
        best: str | None = None
        for base, base_path in self._by_origin.get(origin, ()):
            below = path.startswith(base_path) and (
                len(path) == len(base_path) or path[len(base_path)] == "/"
            )
            if below and (best is None or len(base) > len(best)):
                best = base
        return best

    def __repr__(self) -> str:
        return f"AllowList({sorted(self._bases)!r})"


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError):
        return True
    if not isinstance(exc, httpx.TimeoutException):
        return False
    # httpx-aiohttp maps every aiohttp connection error (e.g. "server
    # disconnected") to httpx.ConnectTimeout; the aiohttp cause tells the truth.
    cause = exc.__cause__
    return not (isinstance(cause, aiohttp.ClientError) and not isinstance(cause, TimeoutError))


def _transport_error(exc: BaseException, url: httpx.URL | str) -> NodeCallError:
    if _is_timeout(exc):
        return NodeCallError("timeout", f"timed out talking to {url}: {exc!r}")
    return NodeCallError("transport", f"transport error talking to {url}: {exc!r}")


# Errors that mean the exchange itself failed, whichever layer noticed it.
_TRANSPORT_EXCEPTIONS = (httpx.HTTPError, aiohttp.ClientError, OSError)


class NodeClient:
    """The per-process client for cluster calls; see the module docstring.

    The underlying httpx client is built on first use and is then bound to
    that event loop (aiohttp sessions cannot move between loops).
    """

    def __init__(
        self,
        *,
        token: str,
        allow: AllowList,
        control_timeout: float,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        transport: httpx.AsyncBaseTransport | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        # The token goes into a header: control characters would allow header
        # injection, and httpx cannot encode non-ASCII header values anyway.
        if not token or not token.strip() or not token.isascii() or not token.isprintable():
            raise ValueError("cluster token must be a non-empty printable ASCII string")
        if control_timeout <= 0:
            raise ValueError("control_timeout must be positive")
        if max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        self._token = token
        self._allow = allow
        self._checked: dict[tuple[frozenset[str], str, str], str] = {}
        self._control_timeout = float(control_timeout)
        self._max_body_bytes = max_body_bytes
        self._transport = transport
        self._ssl_context = ssl_context
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def allow(self) -> AllowList:
        return self._allow

    @property
    def ssl(self) -> ssl.SSLContext | bool:
        """What calls to `https://` nodes verify against (and show): for the hot path's
        aiohttp requests, which do not go through this client's transport."""
        return self._ssl_context if self._ssl_context is not None else True

    def _get_client(self) -> httpx.AsyncClient:
        if self._closed:
            raise NodeCallError("transport", "node client is closed")
        loop = asyncio.get_running_loop()
        if self._client is None:
            transport = self._transport or AiohttpTransport(
                verify=self.ssl,
                limits=httpx.Limits(
                    max_connections=POOL_MAX_CONNECTIONS,
                    max_keepalive_connections=POOL_MAX_KEEPALIVE_CONNECTIONS,
                ),
            )
            self._client = httpx.AsyncClient(
                transport=transport,
                follow_redirects=False,
                # Environment proxies would see the cluster token.
                trust_env=False,
                timeout=self._control_timeouts(self._control_timeout),
            )
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError(
                "NodeClient was first used on another event loop; build one per event loop"
            )
        return self._client

    @staticmethod
    def _control_timeouts(total_secs: float) -> httpx.Timeout:
        return httpx.Timeout(
            connect=min(CONNECT_TIMEOUT_SECS, total_secs),
            read=total_secs,
            write=total_secs,
            pool=total_secs,
        )

    def _resolve(self, base_url: str, path: str) -> tuple[str, httpx.URL]:
        """The allowed base and the full URL for a call, or NodeCallError("not_allowed")."""
        try:
            base = normalize_base_url(base_url)
        except ValueError as exc:
            raise NodeCallError("not_allowed", f"invalid node URL {base_url!r}: {exc}") from exc
        allowed_base = self._allow.base_for(base)
        if allowed_base is None:
            raise NodeCallError("not_allowed", f"node URL {base} is not on the allow-list")
        if path and not path.startswith("/"):
            raise NodeCallError("not_allowed", f"path must start with '/': {path!r}")
        try:
            url = httpx.URL(base + path)
        except (httpx.InvalidURL, ValueError) as exc:
            raise NodeCallError("not_allowed", f"invalid path {path!r}: {exc}") from exc
        # The path may carry `..` segments that httpx resolves, so the URL that
        # will actually be sent is checked, not the inputs.
        if not _is_at_or_below(allowed_base, str(url)):
            raise NodeCallError("not_allowed", f"{url} is outside the allowed base {allowed_base}")
        return allowed_base, url

    def _control_headers(self, *, has_body: bool) -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json",
            # Compressed bodies would be inflated before the size cap sees them.
            "Accept-Encoding": "identity",
        }
        if has_body:
            headers["Content-Type"] = "application/json"
        return headers

    async def call_json(
        self,
        method: str,
        base_url: str,
        path: str,
        *,
        json: Any = None,
        # The contract fixes this name; it is applied with asyncio.timeout inside.
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> tuple[int, Any]:
        """A buffered control call; returns (status, decoded JSON) for any status.

        A 204 reply decodes to None; any other body must be JSON.
        """
        status, body = await self._call_raw(method, base_url, path, json=json, limit_secs=timeout)
        return status, self._decode(status, body)

    async def call_ok(
        self,
        method: str,
        base_url: str,
        path: str,
        *,
        json: Any = None,
        # The contract fixes this name; it is applied with asyncio.timeout inside.
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        """Like call_json, but a non-2xx status raises NodeCallError("status")."""
        status, body = await self._call_raw(method, base_url, path, json=json, limit_secs=timeout)
        # Checked before decoding: error replies are often plain text
        # (the auth middleware answers `unauthorized`).
        if not 200 <= status < 300:
            preview = body[:ERROR_PREVIEW_BYTES].decode("utf-8", "replace")
            raise NodeCallError(
                "status",
                f"{method} {base_url}{path} returned {status}: {preview}",
                status=status,
                body=body,
            )
        return self._decode(status, body)

    @staticmethod
    def _decode(status: int, body: bytes) -> Any:
        if status == 204 and not body:
            return None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise NodeCallError(
                "invalid_json", f"response is not JSON: {exc}", status=status, body=body
            ) from exc

    async def _call_raw(
        self,
        method: str,
        base_url: str,
        path: str,
        *,
        json: Any,
        limit_secs: float | None,
    ) -> tuple[int, bytes]:
        allowed_base, url = self._resolve(base_url, path)
        content = None if json is None else orjson.dumps(json)
        if content is not None and len(content) > self._max_body_bytes:
            raise NodeCallError(
                "too_large",
                f"request body of {len(content)} bytes exceeds {self._max_body_bytes} bytes",
            )
        total_secs = self._control_timeout if limit_secs is None else float(limit_secs)
        if total_secs <= 0:
            raise ValueError("timeout must be positive")
        client = self._get_client()
        try:
            async with asyncio.timeout(total_secs):
                return await self._exchange(
                    client, method.upper(), url, allowed_base, content, total_secs
                )
        except TimeoutError as exc:
            raise NodeCallError(
                "timeout", f"{method} {url} did not complete within {total_secs} s"
            ) from exc

    async def _exchange(
        self,
        client: httpx.AsyncClient,
        method: str,
        url: httpx.URL,
        allowed_base: str,
        content: bytes | None,
        total_secs: float,
    ) -> tuple[int, bytes]:
        request_timeouts = self._control_timeouts(total_secs)
        for _hop in range(MAX_REDIRECTS + 1):
            # Headers are rebuilt for every hop, so the token is re-attached
            # only to targets that passed the allow-list check below.
            request = client.build_request(
                method,
                url,
                content=content,
                headers=self._control_headers(has_body=content is not None),
                timeout=request_timeouts,
            )
            try:
                response = await client.send(request, stream=True)
            except _TRANSPORT_EXCEPTIONS as exc:
                raise _transport_error(exc, url) from exc
            try:
                location = response.headers.get("location")
                if response.status_code in REDIRECT_STATUSES and location is not None:
                    url = self._redirect_target(url, location, allowed_base)
                    if response.status_code == 303 or (
                        response.status_code in (301, 302) and method == "POST"
                    ):
                        method, content = ("HEAD" if method == "HEAD" else "GET"), None
                    continue
                body = await self._read_capped(response, url)
                return response.status_code, body
            finally:
                await response.aclose()
        raise NodeCallError("redirect", f"more than {MAX_REDIRECTS} redirects from {url}")

    @staticmethod
    def _redirect_target(current: httpx.URL, location: str, allowed_base: str) -> httpx.URL:
        try:
            target = current.join(location)
        except (httpx.InvalidURL, ValueError) as exc:
            raise NodeCallError("redirect", f"invalid redirect target {location!r}") from exc
        target = target.copy_with(fragment=None)
        if not _is_at_or_below(allowed_base, str(target)):
            raise NodeCallError(
                "redirect", f"refusing redirect from {current} to {target} outside {allowed_base}"
            )
        return target

    async def _read_capped(self, response: httpx.Response, url: httpx.URL) -> bytes:
        cap = self._max_body_bytes
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise NodeCallError(
                "too_large",
                f"response from {url} declares {declared} bytes, over {cap} bytes",
                status=response.status_code,
            )
        chunks: list[bytes] = []
        received = 0
        try:
            async for chunk in response.aiter_bytes():
                received += len(chunk)
                if received > cap:
                    raise NodeCallError(
                        "too_large",
                        f"response from {url} exceeds {cap} bytes",
                        status=response.status_code,
                    )
                chunks.append(chunk)
        except _TRANSPORT_EXCEPTIONS as exc:
            raise _transport_error(exc, url) from exc
        return b"".join(chunks)

    def checked_url(self, base_url: str, path: str) -> str:
        """The full URL of `path` below an allowed base; NodeCallError("not_allowed") otherwise.

        For the inference hot path, which sends through the process's aiohttp session rather
        than this client: the same allow-list decides where the token may go. Answers are
        cached per allow-list state (the check costs ~70 µs; a cluster has few distinct URLs).
        """
        key = (self._allow.bases, base_url, path)
        url = self._checked.get(key)
        if url is None:
            url = str(self._resolve(base_url, path)[1])
            if len(self._checked) >= CHECKED_URL_CACHE_SIZE:
                self._checked.clear()
            self._checked[key] = url
        return url

    @property
    def authorization(self) -> str:
        return f"Bearer {self._token}"

    def stream(
        self,
        method: str,
        base_url: str,
        path: str,
        *,
        content: bytes,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None = None,
    ) -> AbstractAsyncContextManager[httpx.Response]:
        """Forward a request and hand back the unread response for raw relaying.

        Only the connect phase is timed: a generation may legitimately stay
        silent for minutes, so the caller's own deadline bounds the rest.
        Redirects are not followed; a 3xx is returned like any other status.
        Transport errors while the caller iterates the body surface as
        NodeCallError too.
        """
        return self._stream(method, base_url, path, content, headers, params)

    @contextlib.asynccontextmanager
    async def _stream(
        self,
        method: str,
        base_url: str,
        path: str,
        content: bytes,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None,
    ) -> AsyncIterator[httpx.Response]:
        _allowed_base, url = self._resolve(base_url, path)
        client = self._get_client()
        outgoing = httpx.Headers(headers)
        for name in _connection_listed_headers(outgoing):
            outgoing.pop(name, None)
        for name in HOP_BY_HOP_HEADERS:
            outgoing.pop(name, None)
        # The caller's credential (an inference key) must not reach the node,
        # and the node accepts only the cluster token on its node routes.
        outgoing.pop("authorization", None)
        outgoing["Authorization"] = f"Bearer {self._token}"
        request = client.build_request(
            method.upper(),
            url,
            content=content,
            headers=outgoing,
            params=params,
            timeout=httpx.Timeout(connect=CONNECT_TIMEOUT_SECS, read=None, write=None, pool=None),
        )
        try:
            response = await client.send(request, stream=True)
        except _TRANSPORT_EXCEPTIONS as exc:
            raise _transport_error(exc, url) from exc
        try:
            yield response
        # Only httpx errors: anything else comes from the caller's own side
        # (e.g. its client hanging up) and is not a node failure.
        except httpx.HTTPError as exc:
            raise _transport_error(exc, url) from exc
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        elif self._transport is not None:
            await self._transport.aclose()


def _connection_listed_headers(headers: httpx.Headers) -> list[str]:
    listed: list[str] = []
    for value in headers.get_list("connection"):
        listed.extend(token.strip().lower() for token in value.split(",") if token.strip())
    return listed
