"""Node routes under token rotation and mutual TLS, in both guards: the front door's gate and
the app (for requests that reach it another way). The real handshake is in
tests/test_tls_cluster.py; here the scope's `router.tls_client_cert` stands for it, and for the
front door a fake transport's `peercert` (test_frontdoor.py)."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trustme
from asgiref.testing import ApplicationCommunicator

from proxy.edge.app import ProxyApp
from proxy.edge.gate import Gate
from proxy.edge.tls import CLIENT_CERT_SCOPE_KEY
from proxy.node import Node, build_node
from proxy.tests.doorharness import KEYED, PEERCERT, Door, body_of, status_of, turn
from registry.httpclient import close_session
from routerproject.config import RouterConfig, load_config

NEW = "new-cluster-token-0123456789"
OLD = "old-cluster-token-0123456789"
NODE_PATH = "/router/v1/node/runtime-status"


def _config(tmp_path: Path, extra: str = "") -> RouterConfig:
    (tmp_path / "kcpps").mkdir(exist_ok=True)
    path = tmp_path / "config.yaml"
    text = f"""
        cluster:
          role: master
          node_id: auth-test
          token: {NEW}
          previous_tokens: [{OLD}]
          store_dir: {tmp_path / "store"}
        """
    path.write_text(textwrap.dedent(text) + textwrap.dedent(extra))
    return load_config(path, environ={})


def _tls_keys(tmp_path: Path) -> str:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    return f"""
        server:
          tls_cert_file: {tmp_path / "cert.pem"}
          tls_key_file: {tmp_path / "key.pem"}
          tls_client_ca_file: {tmp_path / "ca.pem"}
        """


def _bearer(token: str) -> Any:
    return {b"authorization": f"Bearer {token}".encode()}.get


@pytest.mark.parametrize(("token", "accepted"), [(NEW, True), (OLD, True), ("x" * 28, False)])
def test_the_gate_accepts_the_token_and_the_previous_ones(
    tmp_path: Path, token: str, accepted: bool
) -> None:
    gate = Gate(_config(tmp_path))
    refusal = gate.key_refusal("GET", NODE_PATH, _bearer(token))
    assert (refusal is None) is accepted
    if not accepted:
        assert refusal is not None and refusal.status == 401


def test_a_previous_token_opens_only_node_routes(tmp_path: Path) -> None:
    gate = Gate(_config(tmp_path, "auth: {admin_keys: [an-admin-key-0123456789]}\n"))
    refusal = gate.key_refusal("GET", "/router/v1/site/nodes/state", _bearer(OLD))
    assert refusal is not None and refusal.status == 401


@pytest.fixture
async def nodes() -> AsyncIterator[list[Node]]:
    built: list[Node] = []
    try:
        yield built
    finally:
        for node in built:
            await node.runtimes.close()
        await close_session()


async def _get(node: Node, token: str, *, cert: bool | None) -> tuple[int, dict[str, Any]]:
    async def fallback(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("node routes never reach Django")

    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "https",
        "path": NODE_PATH,
        "raw_path": NODE_PATH.encode(),
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 18999),
    }
    if cert is not None:
        scope[CLIENT_CERT_SCOPE_KEY] = cert
    comm = ApplicationCommunicator(ProxyApp(fallback, node_getter=lambda: node), scope)
    await comm.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await comm.receive_output(20)
    body = b""
    while True:
        message = await comm.receive_output(20)
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    return start["status"], orjson.loads(body)


async def test_the_app_accepts_the_previous_token_too(tmp_path: Path, nodes: list[Node]) -> None:
    node = build_node(_config(tmp_path))
    nodes.append(node)
    assert (await _get(node, OLD, cert=None))[0] == 200
    assert (await _get(node, NEW, cert=None))[0] == 200
    assert (await _get(node, "y" * 28, cert=None))[0] == 401


@pytest.mark.parametrize("cert", [None, False])
async def test_with_a_client_ca_the_app_refuses_node_routes_without_a_verified_certificate(
    tmp_path: Path, nodes: list[Node], cert: bool | None
) -> None:
    node = build_node(_config(tmp_path, _tls_keys(tmp_path)))
    nodes.append(node)
    status, body = await _get(node, NEW, cert=cert)
    assert status == 403
    assert body["error"]["code"] == "client_certificate_required"
    # Refused before the token is judged: a wrong token gets the same answer.
    assert (await _get(node, "z" * 28, cert=cert))[0] == 403
    assert (await _get(node, NEW, cert=True))[0] == 200


def _tls_door(doors: Callable[..., Door], tmp_path: Path) -> Door:
    _tls_keys(tmp_path)
    cluster = {
        "role": "master",
        "node_id": "auth-test",
        "token": NEW,
        "previous_tokens": [OLD],
        "store_dir": str(tmp_path / "store"),
    }
    return doors(
        cluster=cluster,
        max_connections_per_client=0,
        tls_cert_file=str(tmp_path / "cert.pem"),
        tls_key_file=str(tmp_path / "key.pem"),
        tls_client_ca_file=str(tmp_path / "ca.pem"),
    )


def _node_get(token: str) -> bytes:
    return f"GET {NODE_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()


@pytest.mark.parametrize("token", [NEW, "z" * 28])
@pytest.mark.parametrize("peercert", [None, {}], ids=["no-certificate", "unverified"])
async def test_with_a_client_ca_the_front_door_refuses_node_routes_without_a_certificate(
    doors: Callable[..., Door], tmp_path: Path, token: str, peercert: dict[str, Any] | None
) -> None:
    door = _tls_door(doors, tmp_path)
    protocol, transport = door.connect(tls=True, peercert=peercert)
    protocol.data_received(_node_get(token))
    await turn()
    # Refused before the token is judged: a wrong token gets the same answer.
    assert status_of(transport.data) == 403
    assert body_of(transport.data)["error"]["code"] == "client_certificate_required"
    assert door.app.started == 0


async def test_with_a_client_ca_a_verified_certificate_reaches_the_app_and_is_told_to_it(
    doors: Callable[..., Door], tmp_path: Path
) -> None:
    door = _tls_door(doors, tmp_path)
    protocol, transport = door.connect(tls=True, peercert=PEERCERT)
    protocol.data_received(_node_get(OLD))
    await turn()
    assert status_of(transport.take()) == 200
    assert door.app.scopes[0][CLIENT_CERT_SCOPE_KEY] is True
    # The certificate opens the door to the token's verdict, not past it.
    protocol.data_received(_node_get("z" * 28))
    await turn()
    assert status_of(transport.data) == 401
    assert door.app.started == 1


WEBSOCKET = (
    b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\n"
    + KEYED
    + b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def _websocket(door: Door, *, tls: bool, peercert: dict[str, Any] | None) -> Any:
    """Upgrade a connection; the WebSocket protocol it was handed to."""
    protocol, transport = door.connect(tls=tls, peercert=peercert)
    protocol.data_received(WEBSOCKET)
    await turn()
    assert transport.protocol is not None and transport.protocol is not protocol
    return transport.protocol


@pytest.mark.parametrize(
    ("tls", "peercert", "scheme", "cert"),
    [(True, PEERCERT, "wss", True), (True, None, "wss", False), (False, None, "ws", False)],
    ids=["tls-certificate", "tls", "plain"],
)
async def test_a_websocket_is_told_wss_and_handed_whether_a_certificate_came(
    doors: Callable[..., Door],
    tls: bool,
    peercert: dict[str, Any] | None,
    scheme: str,
    cert: bool,
) -> None:
    door = doors(max_connections_per_client=0)
    socket = await _websocket(door, tls=tls, peercert=peercert)
    assert socket.client_cert is cert
    assert [s["type"] for s in door.app.scopes] == ["websocket"]
    assert door.app.scopes[0]["scheme"] == scheme


async def test_a_websocket_scope_says_whether_a_certificate_came(
    doors: Callable[..., Door],
) -> None:
    door = doors(max_connections_per_client=0)
    await _websocket(door, tls=True, peercert=PEERCERT)
    assert door.app.scopes[0].get(CLIENT_CERT_SCOPE_KEY) is True
