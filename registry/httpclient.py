"""The process's one pooled HTTP client: for backends, and for inference hops between nodes
(forwarding to the node that holds a model, lending's relays through the master).

aiohttp's client is used directly on the hot path: measured here, httpx's own pool added
several milliseconds per request, and the proxy forwards raw bytes anyway. The session is
created lazily on the running loop (the one it must belong to is not running when the
node is built) and replaced if the loop changes, which is what happens between tests.
"""

from __future__ import annotations

import asyncio

import aiohttp

_session: aiohttp.ClientSession | None = None
_session_loop: asyncio.AbstractEventLoop | None = None

CONNECT_TIMEOUT_SECS = 10.0


def get_session() -> aiohttp.ClientSession:
    global _session, _session_loop
    loop = asyncio.get_running_loop()
    if _session is None or _session.closed or _session_loop is not loop:
        connector = aiohttp.TCPConnector(
            limit=0,  # the runtimes bound concurrency; the pool must never add a second queue
            keepalive_timeout=30,
            enable_cleanup_closed=True,
        )
        _session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECS),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            # Backends and nodes set no cookies the router should replay; the real jar filters
            # every request's and answer's headers for nothing.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        _session_loop = loop
    return _session


async def close_session() -> None:
    global _session, _session_loop
    if _session is not None and not _session.closed:
        await _session.close()
    _session = None
    _session_loop = None
