"""WebSockets inside the connection limits, on one real node and real sockets from several
loopback addresses (127.0.0.2, .3, … are loopback on Linux).

`/v1/realtime` sessions count in `server.max_connections_per_client` and in the node-wide
`server.max_connections`, whose last place is kept for `/healthz` and the node protocol; the
refusals are logged once per kind per interval. The Nodes page shows a session holding a lane.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page
from websockets.sync.client import ClientConnection, connect

from tests.harness import (
    CLUSTER_TOKEN,
    ModelSpec,
    RouterNode,
    free_port,
    running_node,
    sim_weights,
    wait_for,
)

pytestmark = pytest.mark.integration

# Room for a browser's parallel connections from 127.0.0.1.
PER_CLIENT = 8
# Reserve: 1 place (proxy.edge.caps.reserve_for), so 19 ordinary ones.
TOTAL = 20
ORDINARY = TOTAL - 1
PROBE = "127.0.0.9"
TOKEN = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    weights = sim_weights(base_ms=1)
    talk = ModelSpec("talk", {"contextsize": 4096}, {"model_param": weights, "ttsmodel": weights})
    port = free_port()
    with running_node(
        tmp_path_factory.mktemp("ws-limits"),
        [talk],
        port=port,
        server={"max_connections_per_client": PER_CLIENT, "max_connections": TOTAL},
        cluster={
            "role": "master",
            "token": CLUSTER_TOKEN,
            "public_url": f"http://127.0.0.1:{port}",
        },
    ) as n:
        yield n


def session(node: RouterNode, source: str) -> ClientConnection:
    url = node.base_url.replace("http://", "ws://") + "/v1/realtime?model=talk"
    ws = connect(url, open_timeout=30, source_address=(source, 0))
    ws.send("hi")
    ws.recv(timeout=10)  # the echo: the session is relayed, not refused
    return ws


def refusal_status(node: RouterNode, source: str) -> int | None:
    """The status a refused session's opening handshake got; None when the connection closed
    before any answer. Asked over a plain socket: the websockets client, refused and closed on
    at once, could trip on an assertion of its own (a race between its threads) instead of
    reporting the refusal."""
    host, port = node.base_url.removeprefix("http://").rsplit(":", 1)
    handshake = (
        f"GET /v1/realtime?model=talk HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0)) as s:
        s.sendall(handshake.encode())
        answer = b""
        while b"\r\n" not in answer:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    # Anything but a refusal (101: the session was let in) fails the test where it is asked.
    return status


def client(node: RouterNode, source: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=source)
    return httpx.Client(base_url=node.base_url, transport=transport, timeout=30)


def get(node: RouterNode, source: str, path: str, **kwargs: Any) -> httpx.Response:
    with client(node, source) as c:
        return c.get(path, **kwargs)


def door_free(node: RouterNode) -> bool:
    """Every place given back: a probe from a fresh address gets an ordinary answer."""
    return get(node, "127.0.0.50", "/v1/models").status_code == 200


def test_websockets_count_in_the_per_client_cap(node: RouterNode) -> None:
    with contextlib.ExitStack() as stack:
        for _ in range(PER_CLIENT):
            stack.enter_context(session(node, "127.0.0.2"))
        assert refusal_status(node, "127.0.0.2") == 429
        assert get(node, "127.0.0.2", "/healthz").status_code == 429
        # Another address is not affected.
        assert get(node, "127.0.0.3", "/v1/models").status_code == 200
    wait_for(lambda: get(node, "127.0.0.2", "/v1/models").status_code == 200)


def test_the_node_cap_keeps_its_last_place_for_health_checks_and_node_routes(
    node: RouterNode,
) -> None:
    sources = [f"127.0.0.{10 + i // PER_CLIENT}" for i in range(ORDINARY)]
    with contextlib.ExitStack() as stack:
        for source in sources:
            stack.enter_context(session(node, source))
        # The reserve: a session or an inference request is refused, the rest is answered.
        assert refusal_status(node, PROBE) == 503
        models = get(node, PROBE, "/v1/models")
        assert models.status_code == 503
        assert models.json()["error"]["code"] == "too_many_connections"
        # One reserved place: each probe's connection closes before the next one opens, but the
        # node may take a moment to see the close and give the place back.
        for path in ("/healthz", "/readyz", "/router/v1/node/state"):
            wait_for(lambda p=path: get(node, PROBE, p, headers=TOKEN).status_code == 200)

        # With the reserve taken too, the next connection is refused before its request. The
        # last probe's close may not be seen yet: hold the place once the node gives it back.
        def hold_the_place() -> httpx.Client | None:
            held = client(node, PROBE)
            if held.get("/healthz").status_code == 200:
                return held
            held.close()
            return None

        with contextlib.closing(wait_for(hold_the_place)):
            for _ in range(2):
                assert get(node, PROBE, "/healthz").status_code == 503
    wait_for(lambda: door_free(node))
    # The session refused in the reserve, logged as HTTP refusals are (one line per kind per
    # interval: the /v1/models 503 just after it is held back and counted).
    assert any(
        f"refused: 503 to {PROBE} on /v1/realtime: the node holds {TOTAL} connections" in ln
        for ln in node.lines
    )
    assert (
        sum(
            f"refused: 503 to {PROBE}: the node holds {TOTAL} connections" in ln
            for ln in node.lines
        )
        == 1
    )


def test_the_nodes_state_shows_the_session_holding_a_lane(node: RouterNode) -> None:
    with session(node, "127.0.0.4"), client(node, "127.0.0.5") as c:
        state = c.get("/router/v1/site/nodes/state").json()
        held = [s for b in state["backends"] for s in b["realtime_sessions"]]
        assert [s["model"] for s in held] == ["talk"]
        assert held[0]["idle_secs"] >= 0 and held[0]["since"] > 0
    wait_for(
        lambda: (
            not any(
                b["realtime_sessions"]
                for b in get(node, "127.0.0.5", "/router/v1/site/nodes/state").json()["backends"]
            )
        )
    )


def test_the_nodes_page_shows_the_session_holding_a_lane(
    node: RouterNode, new_page: Callable[..., Page]
) -> None:
    with session(node, "127.0.0.4"):
        tab = new_page()
        tab.goto(node.base_url + "/ui/nodes")
        row = tab.locator('.realtime-sessions li[data-model="talk"]')
        row.wait_for(timeout=15_000)
        text = row.inner_text()
        assert text.startswith("talk holds text-runtime"), text
        assert "since" in text and "idle" in text, text
