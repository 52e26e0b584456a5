# ruff: noqa: F811
"""Stored keys at the node's edge: who may send what, the caller each request carries, and the
model scope on every path family and model list (README, "Giving people keys")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from access.identity import ANONYMOUS, CONFIG, MASTER, STORED, Caller, caller_of
from access.keys import KeyRecord, KeyTable, install_table, reset_for_tests, secret_hash
from proxy.edge.app import ProxyApp
from proxy.edge.gate import Gate

# The node fixture of the ASGI app's tests, shared: each test's `make_node` argument is it.
from proxy.tests.test_app import NodeFactory, _chat, make_node, request  # noqa: F401

Message = dict[str, Any]

ALICE = "rk-" + "A" * 43  # inference, scoped to the model "chat"
OPS = "rk-" + "O" * 43  # admin, every model
GONE = "rk-" + "G" * 43  # expired
T0_MS = 1_750_000_000_000
CONFIG_KEY = "sk-config-inference"
TOKEN = "cluster-token-stored-keys"


def table(clock_ms: Callable[[], int] = lambda: T0_MS) -> KeyTable:
    return KeyTable(
        [
            KeyRecord(name="alice", key_hash=secret_hash(ALICE), models=frozenset({"chat"})),
            KeyRecord(name="ops", key_hash=secret_hash(OPS), role="admin"),
            KeyRecord(name="gone", key_hash=secret_hash(GONE), expires_at_ms=T0_MS - 1),
        ],
        clock_ms=clock_ms,
    )


@pytest.fixture(autouse=True)
def _keys() -> Iterator[None]:
    install_table(table())
    yield
    reset_for_tests()


class Recorder:
    """Stands in for Django: answers 200 and keeps the caller each request carried."""

    def __init__(self) -> None:
        self.callers: list[Caller] = []

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        self.callers.append(caller_of(scope))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def bearer(secret: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", b"Bearer " + secret.encode())]


def error_of(answer: Any) -> Any:
    return answer.json()["error"]


# -- who may send what ---------------------------------------------------------------------------


async def test_a_node_with_stored_keys_needs_a_key_on_client_paths(
    make_node: NodeFactory,
) -> None:
    node = make_node()
    app = ProxyApp(Recorder(), node_getter=lambda: node)
    assert (await request(app, "GET", "/v1/models")).status == 401
    assert (await request(app, "GET", "/v1/models", headers=bearer("rk-unknown"))).status == 401
    assert (await request(app, "GET", "/v1/models", headers=bearer(GONE))).status == 401
    ok = await request(app, "GET", "/v1/models", headers=bearer(OPS))
    assert ok.status == 200
    anthropic = await request(app, "GET", "/v1/models", headers=[(b"x-api-key", OPS.encode())])
    assert anthropic.status == 200
    # Probes stay open.
    assert (await request(app, "GET", "/ping")).status == 200


async def test_without_any_key_a_node_stays_open(make_node: NodeFactory) -> None:
    reset_for_tests()
    node = make_node()
    app = ProxyApp(Recorder(), node_getter=lambda: node)
    assert (await request(app, "GET", "/v1/models")).status == 200


async def test_config_keys_keep_working_beside_stored_keys(make_node: NodeFactory) -> None:
    node = make_node(auth={"inference_keys": [CONFIG_KEY]})
    app = ProxyApp(Recorder(), node_getter=lambda: node)
    assert (await request(app, "GET", "/v1/models", headers=bearer(CONFIG_KEY))).status == 200
    assert (await request(app, "GET", "/v1/models", headers=bearer(ALICE))).status == 200
    assert (await request(app, "GET", "/v1/models", headers=bearer("sk-nope"))).status == 401


async def test_an_admin_role_key_opens_the_management_api_and_is_its_caller(
    make_node: NodeFactory,
) -> None:
    node = make_node()
    django = Recorder()
    app = ProxyApp(django, node_getter=lambda: node)
    path = "/router/v1/site/api-keys"
    assert (await request(app, "GET", path)).status == 401
    assert (await request(app, "GET", path, headers=bearer(ALICE))).status == 401
    assert (await request(app, "GET", path, headers=bearer(OPS))).status == 200
    (caller,) = django.callers
    assert (caller.kind, caller.name, caller.actor) == (STORED, "ops", "ops")


async def test_every_request_let_through_carries_its_caller(
    make_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.conf import settings

    router = settings.ROUTER
    auth = router.auth.model_copy(update={"admin_keys": ["sk-config-admin"]})
    monkeypatch.setattr(settings, "ROUTER", router.model_copy(update={"auth": auth}))
    node = make_node(
        auth={"inference_keys": [CONFIG_KEY], "admin_keys": ["sk-config-admin"]},
        cluster={"node_id": "app-test", "role": "master", "token": TOKEN},
    )
    django = Recorder()
    app = ProxyApp(django, node_getter=lambda: node)
    seen: list[Caller] = []

    async def keep(ctx: Any, node: Any) -> None:
        seen.append(caller_of(ctx.scope))
        await ctx.json(200, {})

    from proxy.edge import nodeapi

    original = nodeapi.NODE_ROUTES["/router/v1/node/state"]
    nodeapi.NODE_ROUTES["/router/v1/node/state"] = (original[0], keep, False)
    try:
        await request(app, "GET", "/router/v1/node/state", headers=bearer(TOKEN))
    finally:
        nodeapi.NODE_ROUTES["/router/v1/node/state"] = original
    await request(app, "GET", "/router/v1/site/api-keys", headers=bearer("sk-config-admin"))
    await request(app, "GET", "/ui/nodes")
    assert seen[0].kind == MASTER and seen[0].actor == "master"
    assert [c.kind for c in django.callers] == [CONFIG, ANONYMOUS]
    assert django.callers[0].actor == "config key"


def test_the_front_door_applies_the_same_key_rules(make_node: NodeFactory) -> None:
    gate = Gate(make_node().config, browser_hosts=None, keys=table)

    def refusal(path: str, headers: dict[bytes, bytes], method: str = "GET") -> int | None:
        found = gate.key_refusal(method, path, headers.get)
        return None if found is None else found.status

    assert refusal("/v1/models", {}) == 401
    assert refusal("/v1/models", {b"authorization": b"Bearer " + ALICE.encode()}) is None
    assert refusal("/v1/models", {b"authorization": b"Bearer " + GONE.encode()}) == 401
    assert (
        refusal("/router/v1/site/api-keys", {b"authorization": b"Bearer " + ALICE.encode()}) == 401
    )
    assert (
        refusal("/router/v1/site/api-keys", {b"authorization": b"Bearer " + OPS.encode()}) is None
    )
    # The WebSocket key subprotocol of the browser SDK carries a stored key too.
    offered = b"realtime, openai-insecure-api-key." + ALICE.encode()
    assert refusal("/v1/realtime", {b"sec-websocket-protocol": offered}) is None
    # With a stored admin key, management writes need the key and no longer the page's origin.
    assert gate.admin_keys_required()


# -- model scope ---------------------------------------------------------------------------------


async def test_a_model_outside_the_keys_scope_is_403_on_every_family(
    make_node: NodeFactory,
) -> None:
    node = make_node()
    app = ProxyApp(Recorder(), node_getter=lambda: node)
    key = bearer(ALICE)
    openai = await request(
        app, "POST", "/v1/chat/completions", _chat("slow", max_tokens=2), headers=key
    )
    assert openai.status == 403
    assert error_of(openai) == {
        "message": 'model "slow" is not allowed for this key (model_not_allowed)',
        "type": "forbidden",
        "code": "model_not_allowed",
        "param": "model",
    }
    embed = await request(
        app, "POST", "/v1/embeddings", {"model": "slow", "input": "x"}, headers=key
    )
    assert embed.status == 403
    ollama = await request(app, "POST", "/api/chat", _chat("slow", max_tokens=2), headers=key)
    assert ollama.status == 403
    # Ollama's own error shape: a string.
    assert "model_not_allowed" in ollama.json()["error"]
    show = await request(app, "POST", "/api/show", {"model": "slow"}, headers=key)
    assert show.status == 403
    kobold = await request(
        app, "POST", "/api/v1/generate", {"model": "slow", "prompt": "hi"}, headers=key
    )
    assert kobold.status == 403 and error_of(kobold)["code"] == "model_not_allowed"
    retrieve = await request(app, "GET", "/v1/models/slow", headers=key)
    assert retrieve.status == 403
    image = await request(
        app, "POST", "/v1/images/generations", {"model": "slow", "prompt": "a cat"}, headers=key
    )
    assert image.status == 403 and error_of(image)["code"] == "model_not_allowed"
    # Refused before the model is looked up: a model the node does not hold is refused alike.
    unknown = await request(app, "POST", "/api/v1/generate", {"model": "elsewhere"}, headers=key)
    assert unknown.status == 403
    # Nothing was loaded for any of them.
    assert not list(node.runtimes.loaded())


async def test_a_model_inside_the_scope_is_served(make_node: NodeFactory) -> None:
    node = make_node()
    app = ProxyApp(Recorder(), node_getter=lambda: node)
    chat = await request(
        app, "POST", "/v1/chat/completions", _chat("chat", max_tokens=2), headers=bearer(ALICE)
    )
    assert chat.status == 200, chat.body


async def test_model_lists_show_only_the_keys_models(make_node: NodeFactory) -> None:
    node = make_node()
    app = ProxyApp(Recorder(), node_getter=lambda: node)
    scoped, every = bearer(ALICE), bearer(OPS)
    listed = await request(app, "GET", "/v1/models", headers=scoped)
    assert [m["id"] for m in listed.json()["data"]] == ["chat"]
    full = await request(app, "GET", "/v1/models", headers=every)
    assert [m["id"] for m in full.json()["data"]] == ["chat", "slow"]
    tags = await request(app, "GET", "/api/tags", headers=scoped)
    assert [m["name"] for m in tags.json()["models"]] == ["chat"]


async def test_kobolds_model_answer_names_only_a_model_the_key_may_use(
    make_node: NodeFactory,
) -> None:
    node = make_node()
    app = ProxyApp(Recorder(), node_getter=lambda: node)
    loaded = await request(
        app, "POST", "/v1/chat/completions", _chat("chat", max_tokens=1), headers=bearer(OPS)
    )
    assert loaded.status == 200
    install_table(
        KeyTable(
            [
                KeyRecord(name="ops", key_hash=secret_hash(OPS), role="admin"),
                KeyRecord(name="slowpoke", key_hash=secret_hash(ALICE), models=frozenset({"slow"})),
            ]
        )
    )
    runs = await request(app, "GET", "/api/v1/model", headers=bearer(OPS))
    assert runs.json() == {"result": "koboldcpp/chat"}
    scoped = await request(app, "GET", "/api/v1/model", headers=bearer(ALICE))
    assert scoped.json() == {"result": "ReadOnly"}
    ps = await request(app, "GET", "/api/ps", headers=bearer(ALICE))
    assert ps.json()["models"] == []
    every = await request(app, "GET", "/api/ps", headers=bearer(OPS))
    assert [m["name"] for m in every.json()["models"]] == ["chat"]


async def test_a_realtime_session_for_a_model_outside_the_scope_is_refused(
    make_node: NodeFactory,
) -> None:
    import orjson
    from asgiref.testing import ApplicationCommunicator

    from proxy.edge.realtime import RealtimeApp

    node = make_node()
    app = RealtimeApp(node_getter=lambda: node)
    scope = {
        "type": "websocket",
        "path": "/v1/realtime",
        "query_string": b"model=slow",
        "headers": [(b"authorization", b"Bearer " + ALICE.encode())],
        "subprotocols": [],
        "client": ("127.0.0.1", 50000),
    }
    comm = ApplicationCommunicator(app, scope)
    await comm.send_input({"type": "websocket.connect"})
    assert (await comm.receive_output(20))["type"] == "websocket.accept"
    event = orjson.loads((await comm.receive_output(20))["text"])
    assert event["error"]["code"] == "model_not_allowed"
    closed = await comm.receive_output(20)
    assert closed["type"] == "websocket.close" and closed["code"] == 4403
    await comm.wait(20)
    assert caller_of(scope).name == "alice"
