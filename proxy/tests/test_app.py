"""Consumer tests of the inference proxy (ProxyApp) over ASGI, against real simulated backends.

A real Node is built from a temp config whose models dir holds simulated configs; requests go
through asgiref's ApplicationCommunicator, so the app sees exactly what an ASGI server gives it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from asgiref.testing import ApplicationCommunicator

from analytics.recorder import RequestSample
from proxy.edge.app import ProxyApp
from proxy.edge.hooks import DISCONNECT_WATCH, DisconnectWatch
from proxy.node import Node, build_node
from proxy.request import WHOLE_ANSWER
from registry.httpclient import close_session, get_session
from routerproject.config import load_config

# receive_output cancels the app when it times out, so timeouts are generous.
MESSAGE_TIMEOUT_SECS = 20.0
CONDITION_TIMEOUT_SECS = 20.0
POLL_SECS = 0.01
MAX_BODY_BYTES = 4096
INFERENCE_KEY = "sk-test-inference-1"

CHAT_WEIGHTS = {"load_ms": 20, "base_ms": 1, "prompt_ms_per_token": 0, "output_ms_per_token": 5}
# Long enough per token that a stream is still running when the client hangs up.
SLOW_WEIGHTS = {"load_ms": 20, "base_ms": 1, "prompt_ms_per_token": 0, "output_ms_per_token": 25}

Message = dict[str, Any]


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    bodies: list[Message] = field(default_factory=list)

    def json(self) -> Any:
        return orjson.loads(self.body)


class Fallback:
    """Stands in for Django: answers every request it is given and remembers the paths."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        self.paths.append(scope["path"])
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"fallback:" + scope["path"].encode()})


NodeFactory = Callable[..., Node]


@pytest.fixture
async def make_node(tmp_path: Path) -> AsyncIterator[NodeFactory]:
    nodes: list[Node] = []

    def factory(**sections: Any) -> Node:
        root = tmp_path / f"node{len(nodes)}"
        kcpps, weights = root / "kcpps", root / "weights"
        kcpps.mkdir(parents=True)
        weights.mkdir()
        for name, costs in (("chat", CHAT_WEIGHTS), ("slow", SLOW_WEIGHTS)):
            (weights / f"{name}.sim.json").write_text(json.dumps(costs))
            (kcpps / f"{name}.kcpps").write_text(
                json.dumps(
                    {
                        "backend_mode": "sim",
                        "model_param": f"../weights/{name}.sim.json",
                        "contextsize": 4096,
                        "parallel": 1,
                    }
                )
            )
        doc: dict[str, Any] = {
            "server": {"bind": "127.0.0.1:18999", "max_body_bytes": MAX_BODY_BYTES},
            "cluster": {"node_id": "app-test", "store_dir": str(root / "store")},
            "models": {"config_dir": str(kcpps)},
            "backend": {"mode": "sim", "load_timeout": "20s"},
        }
        doc.update(sections)
        config_path = root / "config.yaml"
        config_path.write_text(yaml.safe_dump(doc))
        node = build_node(load_config(config_path, environ={}))
        nodes.append(node)
        return node

    try:
        yield factory
    finally:
        for node in nodes:
            await node.runtimes.close()
        await close_session()


@pytest.fixture
def fallback() -> Fallback:
    return Fallback()


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 18999),
    }


def _communicator(
    app: ProxyApp,
    method: str,
    path: str,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> ApplicationCommunicator:
    return ApplicationCommunicator(app, _scope(method, path, headers or []))


async def _posted_chat(
    app: ProxyApp, extension: str | None, doc: dict[str, Any]
) -> ApplicationCommunicator:
    """A chat completion posted whole, under a server that advertises `extension` (None: a
    plain ASGI server)."""
    scope = _scope("POST", "/v1/chat/completions", [])
    if extension is not None:
        scope["extensions"] = {extension: {}}
    comm = ApplicationCommunicator(app, scope)
    await comm.send_input({"type": "http.request", "body": orjson.dumps(doc), "more_body": False})
    return comm


async def _read_answer(comm: ApplicationCommunicator) -> Answer:
    start = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
    assert start["type"] == "http.response.start"
    bodies: list[Message] = []
    while True:
        message = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
        assert message["type"] == "http.response.body"
        bodies.append(message)
        if not message.get("more_body", False):
            break
    await comm.wait(MESSAGE_TIMEOUT_SECS)
    return Answer(
        status=start["status"],
        headers=dict(start.get("headers", [])),
        body=b"".join(m.get("body", b"") for m in bodies),
        bodies=bodies,
    )


async def request(
    app: ProxyApp,
    method: str,
    path: str,
    body: bytes | dict[str, Any] | list[Any] = b"",
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> Answer:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    all_headers = [(b"content-type", b"application/json"), *(headers or [])]
    comm = _communicator(app, method, path, headers=all_headers)
    await comm.send_input({"type": "http.request", "body": data, "more_body": False})
    return await _read_answer(comm)


def _chat(model: str, *, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _capture_samples(monkeypatch: pytest.MonkeyPatch, node: Node) -> list[RequestSample]:
    samples: list[RequestSample] = []
    monkeypatch.setattr(node.recorder, "add_request", samples.append)
    return samples


async def _wait_for(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONDITION_TIMEOUT_SECS
    while not await predicate():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(POLL_SECS)


def _sse_events(body: bytes) -> list[str]:
    return [
        line[len("data: ") :] for line in body.decode().splitlines() if line.startswith("data: ")
    ]


# -- answers ----------------------------------------------------------------------------


async def test_a_chat_request_gets_the_backends_whole_answer(
    make_node: NodeFactory, fallback: Fallback, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node()
    samples = _capture_samples(monkeypatch, node)
    app = ProxyApp(fallback, node_getter=lambda: node)

    answer = await request(app, "POST", "/v1/chat/completions", _chat("chat", max_tokens=3))

    assert answer.status == 200
    assert answer.headers[b"content-type"].startswith(b"application/json")
    doc = answer.json()
    assert doc["model"] == "chat"
    assert doc["choices"][0]["message"] == {"role": "assistant", "content": "the quick brown"}
    assert doc["usage"]["completion_tokens"] == 3
    assert [m.get("more_body", False) for m in answer.bodies] == [False]
    assert fallback.paths == []
    text = node.runtimes.runtimes["text"]
    assert (text.state, text.current and text.current.local_id, text.active) == (
        "ready",
        "chat",
        0,
    )
    [sample] = samples
    assert (sample.model_id, sample.lane, sample.status, sample.success) == (
        "chat",
        "text",
        200,
        True,
    )
    assert (sample.stream, sample.output_tokens) == (False, 3)


async def test_a_streamed_answer_arrives_as_several_body_messages(
    make_node: NodeFactory, fallback: Fallback, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node()
    samples = _capture_samples(monkeypatch, node)
    app = ProxyApp(fallback, node_getter=lambda: node)

    # 25 ms between tokens: at 5 ms a loaded machine can deliver the whole
    # stream in one read, which is coalescing, not buffering.
    answer = await request(
        app, "POST", "/v1/chat/completions", _chat("slow", max_tokens=6, stream=True)
    )

    assert answer.status == 200
    assert answer.headers[b"content-type"].startswith(b"text/event-stream")
    flags = [m.get("more_body", False) for m in answer.bodies]
    assert flags[-1] is False
    assert flags[:-1] == [True] * (len(flags) - 1)
    assert len(flags) >= 3, "the stream was buffered instead of passed through"
    events = _sse_events(answer.body)
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "the quick brown fox jumps over"
    [sample] = samples
    assert (sample.stream, sample.status, sample.output_tokens) == (True, 200, 6)


@pytest.mark.parametrize("nodes_server", [False, True], ids=["plain-asgi", "nodes-server"])
async def test_a_client_that_hangs_up_mid_stream_cancels_the_backend_request(
    make_node: NodeFactory,
    fallback: Fallback,
    monkeypatch: pytest.MonkeyPatch,
    nodes_server: bool,
) -> None:
    # Under plain ASGI the app hears `http.disconnect`. The node's own server advertises the
    # disconnect watch: the app hands it one instead of keeping a task waiting on that
    # message, and the server firing it must do what the message did.
    node = make_node()
    samples = _capture_samples(monkeypatch, node)
    app = ProxyApp(fallback, node_getter=lambda: node)
    extension = DISCONNECT_WATCH if nodes_server else None
    comm = await _posted_chat(app, extension, _chat("slow", max_tokens=400, stream=True))

    watch: DisconnectWatch | None = None
    if nodes_server:
        handed = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
        assert handed["type"] == DISCONNECT_WATCH
        watch = handed["watch"]
        assert isinstance(watch, DisconnectWatch)
    start = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
    assert (start["type"], start["status"]) == ("http.response.start", 200)
    first = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
    assert first["more_body"] is True
    runtime = node.runtimes.runtimes["text"]
    assert runtime.active == 1 and runtime.launch is not None
    stats_url = runtime.launch.base_url + "/sim/stats"

    if watch is not None:
        watch.fire()
    else:
        await comm.send_input({"type": "http.disconnect"})
    await comm.wait(MESSAGE_TIMEOUT_SECS)
    assert comm.future.done() and not comm.future.cancelled()
    assert runtime.active == 0

    async def backend_cancelled() -> bool:
        async with get_session().get(stats_url) as resp:
            stats = await resp.json()
        return bool(stats["cancelled"] == 1 and stats["active"] == 0)

    await _wait_for(backend_cancelled, "the backend counts the request as cancelled")
    [sample] = samples
    assert (sample.status, sample.success) == (499, False)


async def test_a_finished_request_cancels_its_disconnect_watch(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    comm = await _posted_chat(app, DISCONNECT_WATCH, _chat("chat", max_tokens=1))
    handed = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
    answer = await _read_answer(comm)
    assert answer.status == 200
    # Cancelled, so the cycle that holds it no longer holds the request through its callback.
    assert handed["watch"].callback is None


async def test_under_the_nodes_server_an_answer_goes_out_whole(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    comm = await _posted_chat(app, WHOLE_ANSWER, _chat("nope", max_tokens=1))
    answer = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
    assert (answer["type"], answer["status"]) == (WHOLE_ANSWER, 404)
    assert orjson.loads(answer["body"])["error"]["param"] == "model"
    await comm.wait(MESSAGE_TIMEOUT_SECS)


# -- errors -----------------------------------------------------------------------------


async def test_an_unknown_model_gets_a_404_envelope_and_loads_nothing(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    answer = await request(app, "POST", "/v1/chat/completions", _chat("nope", max_tokens=1))
    assert answer.status == 404
    assert answer.json() == {
        "error": {
            "message": 'model "nope" was not found; the models here are: chat, slow',
            "type": "invalid_request_error",
            "code": "model_not_found",
            "param": "model",
        }
    }
    assert node.runtimes.runtimes["text"].state == "empty"


async def test_an_unknown_model_on_an_ollama_path_gets_ollamas_error_shape(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    answer = await request(app, "POST", "/api/chat", {"model": "nope", "messages": []})
    assert answer.status == 404
    assert answer.json() == {"error": 'model "nope" was not found; the models here are: chat, slow'}


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (b"", "request body is empty; a JSON object is required", None),
        (b"{not json", "invalid JSON body", None),
        (b"[1, 2]", "request body must be a JSON object", None),
        (b'{"messages": []}', "model is required", "model"),
        (b'{"model": 7, "messages": []}', "model must be a string", "model"),
    ],
    ids=["empty", "invalid-json", "not-an-object", "no-model", "model-not-a-string"],
)
async def test_a_malformed_request_gets_a_400_envelope(
    make_node: NodeFactory, fallback: Fallback, body: bytes, message: str, param: str | None
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    answer = await request(app, "POST", "/v1/chat/completions", body)
    assert answer.status == 400
    error = answer.json()["error"]
    assert error["message"].startswith(message)
    assert error["type"] == "invalid_request_error"
    assert error.get("param") == param
    assert node.runtimes.runtimes["text"].state == "empty"


async def test_a_body_declared_larger_than_the_limit_gets_a_413_envelope(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    size = str(MAX_BODY_BYTES + 1).encode()
    comm = _communicator(app, "POST", "/v1/chat/completions", headers=[(b"content-length", size)])
    answer = await _read_answer(comm)
    assert answer.status == 413
    error = answer.json()["error"]
    assert error["code"] == "body_too_large"
    assert str(MAX_BODY_BYTES) in error["message"]


async def test_a_body_that_grows_past_the_limit_in_chunks_gets_a_413_envelope(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    comm = _communicator(app, "POST", "/v1/chat/completions")
    half = b"x" * (MAX_BODY_BYTES // 2 + 1)
    await comm.send_input({"type": "http.request", "body": half, "more_body": True})
    await comm.send_input({"type": "http.request", "body": half, "more_body": True})
    answer = await _read_answer(comm)
    assert answer.status == 413
    assert answer.json()["error"]["code"] == "body_too_large"
    assert node.runtimes.runtimes["text"].state == "empty"


async def test_a_body_exactly_at_the_limit_is_read(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    doc = _chat("nope", max_tokens=1)
    raw = orjson.dumps(doc)
    doc["pad"] = "x" * (MAX_BODY_BYTES - len(raw) - len(b',"pad":""'))
    body = orjson.dumps(doc)
    assert len(body) == MAX_BODY_BYTES
    answer = await request(app, "POST", "/v1/chat/completions", body)
    # The body was accepted and parsed: the model lookup is what answers.
    assert answer.status == 404


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", b"POST"),
        ("POST", "/v1/models", b"GET, HEAD"),
        ("DELETE", "/api/tags", b"GET, HEAD"),
    ],
)
async def test_a_wrong_method_gets_a_405_envelope_with_allow(
    make_node: NodeFactory, fallback: Fallback, method: str, path: str, allow: bytes
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    answer = await request(app, method, path)
    assert answer.status == 405
    assert answer.headers[b"allow"] == allow
    body = answer.json()
    message = body["error"] if path.startswith("/api/") else body["error"]["message"]
    assert message == f"method {method} is not allowed on {path}"
    assert fallback.paths == []


# -- inference keys ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        b"Bearer sk-wrong",
        b"Bearer ",
        b"Basic " + INFERENCE_KEY.encode(),
        INFERENCE_KEY.encode(),
    ],
    ids=["none", "wrong-key", "empty-bearer", "basic-scheme", "no-scheme"],
)
async def test_without_the_right_bearer_key_an_inference_path_answers_401(
    make_node: NodeFactory, fallback: Fallback, authorization: bytes | None
) -> None:
    node = make_node(auth={"inference_keys": [INFERENCE_KEY]})
    app = ProxyApp(fallback, node_getter=lambda: node)
    headers = [(b"authorization", authorization)] if authorization is not None else []
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
        body = _chat("chat", max_tokens=1) if method == "POST" else b""
        answer = await request(app, method, path, body, headers=headers)
        assert answer.status == 401
        assert answer.json()["error"]["type"] == "unauthorized"
    assert node.runtimes.runtimes["text"].state == "empty"


async def test_the_right_bearer_key_is_let_through(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node(auth={"inference_keys": ["sk-other-key-0", INFERENCE_KEY]})
    app = ProxyApp(fallback, node_getter=lambda: node)
    headers = [(b"authorization", b"Bearer " + INFERENCE_KEY.encode())]
    models = await request(app, "GET", "/v1/models", headers=headers)
    assert models.status == 200
    assert sorted(m["id"] for m in models.json()["data"]) == ["chat", "slow"]
    chat = await request(
        app, "POST", "/v1/chat/completions", _chat("chat", max_tokens=2), headers=headers
    )
    assert chat.status == 200
    assert chat.json()["choices"][0]["message"]["content"] == "the quick"


@pytest.mark.parametrize(
    ("api_key", "status"), [(INFERENCE_KEY.encode(), 200), (b"sk-wrong", 401), (b" ", 401)]
)
async def test_the_anthropic_sdks_x_api_key_header_carries_the_inference_key(
    make_node: NodeFactory, fallback: Fallback, api_key: bytes, status: int
) -> None:
    node = make_node(auth={"inference_keys": [INFERENCE_KEY]})
    app = ProxyApp(fallback, node_getter=lambda: node)
    answer = await request(app, "GET", "/v1/models", headers=[(b"x-api-key", api_key)])
    assert answer.status == status


async def test_ping_needs_no_inference_key(make_node: NodeFactory, fallback: Fallback) -> None:
    node = make_node(auth={"inference_keys": [INFERENCE_KEY]})
    app = ProxyApp(fallback, node_getter=lambda: node)
    answer = await request(app, "GET", "/ping")
    assert (answer.status, answer.json()) == (200, {"status": "healthy"})


async def test_without_configured_keys_no_bearer_is_needed(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    answer = await request(app, "GET", "/v1/models")
    assert answer.status == 200


# -- everything else --------------------------------------------------------------------


# Every `/v1/…` path is the text catch-all's (proxy/edge/routes.py), so none of them is here.
@pytest.mark.parametrize("path", ["/admin/", "/api/v1/nodes", "/v0/chat/completions", "/"])
async def test_a_path_the_proxy_does_not_claim_goes_to_the_fallback(
    make_node: NodeFactory, fallback: Fallback, path: str
) -> None:
    node = make_node(auth={"inference_keys": [INFERENCE_KEY]})
    app = ProxyApp(fallback, node_getter=lambda: node)
    answer = await request(app, "GET", path)
    assert (answer.status, answer.body) == (200, b"fallback:" + path.encode())
    assert fallback.paths == [path]


async def test_a_non_http_connection_goes_to_the_fallback(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    scope = {"type": "websocket", "path": "/v1/chat/completions", "headers": []}
    comm = ApplicationCommunicator(app, scope)
    await comm.wait(MESSAGE_TIMEOUT_SECS)
    assert comm.future.done() and not comm.future.cancelled()
    assert fallback.paths == ["/v1/chat/completions"]


# -- request IDs ------------------------------------------------------------------------


async def test_a_clients_request_id_comes_back_and_is_recorded(
    make_node: NodeFactory, fallback: Fallback, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node()
    samples = _capture_samples(monkeypatch, node)
    app = ProxyApp(fallback, node_getter=lambda: node)

    answer = await request(
        app,
        "POST",
        "/v1/chat/completions",
        _chat("chat", max_tokens=2),
        headers=[(b"x-request-id", b"client-trace-42")],
    )

    assert answer.status == 200
    assert answer.headers[b"x-request-id"] == b"client-trace-42"
    assert [s.request_id for s in samples] == ["client-trace-42"]


async def test_without_a_request_id_each_answer_gets_a_new_one(
    make_node: NodeFactory, fallback: Fallback, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node()
    samples = _capture_samples(monkeypatch, node)
    app = ProxyApp(fallback, node_getter=lambda: node)

    first = await request(app, "POST", "/v1/chat/completions", _chat("chat", max_tokens=1))
    second = await request(
        app,
        "POST",
        "/v1/chat/completions",
        _chat("chat", max_tokens=1),
        headers=[(b"x-request-id", b"not usable")],
    )

    ids = [first.headers[b"x-request-id"], second.headers[b"x-request-id"]]
    assert all(re.fullmatch(rb"[0-9a-f]{32}", i) for i in ids) and ids[0] != ids[1]
    assert [s.request_id for s in samples] == [i.decode() for i in ids]


async def test_errors_and_the_fallbacks_answers_carry_the_request_id_too(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    trace = [(b"x-request-id", b"t-1")]

    unknown = await request(
        app, "POST", "/v1/chat/completions", _chat("nope", max_tokens=1), headers=trace
    )
    wrong_method = await request(app, "GET", "/v1/chat/completions", headers=trace)
    managed = await request(app, "GET", "/router/v1/version", headers=trace)

    assert unknown.status == 404 and unknown.headers[b"x-request-id"] == b"t-1"
    assert wrong_method.status == 405 and wrong_method.headers[b"x-request-id"] == b"t-1"
    assert managed.body == b"fallback:/router/v1/version"
    assert managed.headers[b"x-request-id"] == b"t-1"


# -- a node's asset stream ----------------------------------------------------------------


ASSET_TOKEN = "cluster-token-for-assets"


async def _asset_node(make_node: NodeFactory, tmp_path: Path) -> tuple[Node, str, int]:
    """A master holding its own `chat` weights; the hash and size of that file."""
    import hashlib

    cluster = {
        "node_id": "app-test",
        "role": "master",
        "token": ASSET_TOKEN,
        "store_dir": str(tmp_path / "asset-store"),
    }
    node = make_node(cluster=cluster)
    weights = (tmp_path / "node0" / "weights" / "chat.sim.json").read_bytes()
    return node, hashlib.sha256(weights).hexdigest(), len(weights)


async def _asset(app: ProxyApp, digest: str, byte_range: str) -> Answer:
    token = f"Bearer {ASSET_TOKEN}".encode()
    headers = [(b"authorization", token), (b"range", byte_range.encode())]
    return await request(app, "GET", f"/router/v1/node/assets/{digest}", headers=headers)


@pytest.mark.django_db(transaction=True)
async def test_a_range_ending_at_the_files_last_byte_is_served(
    make_node: NodeFactory, fallback: Fallback, tmp_path: Path
) -> None:
    node, digest, size = await _asset_node(make_node, tmp_path)
    app = ProxyApp(fallback, node_getter=lambda: node)

    answer = await _asset(app, digest, f"bytes={size - 1}-")

    assert answer.status == 206
    assert answer.headers[b"content-range"] == f"bytes {size - 1}-{size - 1}/{size}".encode()
    assert len(answer.body) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("last", ["", "+0", "+10"])
async def test_a_range_starting_at_the_files_end_is_416_with_the_size(
    make_node: NodeFactory, fallback: Fallback, tmp_path: Path, last: str
) -> None:
    node, digest, size = await _asset_node(make_node, tmp_path)
    app = ProxyApp(fallback, node_getter=lambda: node)
    end = str(size + int(last)) if last else ""

    answer = await _asset(app, digest, f"bytes={size}-{end}")

    assert answer.status == 416
    assert answer.headers[b"content-range"] == f"bytes */{size}".encode()
    assert answer.json()["error"]["code"] == "range_not_satisfiable"
    assert node.assets.served_streams == 0


# -- addresses ----------------------------------------------------------------------------


async def test_a_junk_x_forwarded_for_hop_from_a_trusted_proxy_gets_a_403_envelope(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    server = {"allowed_cidrs": ["10.0.0.0/8"], "trusted_proxies": ["127.0.0.1/32"]}
    node = make_node(server=server)
    app = ProxyApp(fallback, node_getter=lambda: node)
    junk = [(b"x-forwarded-for", b"10.9.9.9, junk, 127.0.0.1")]

    answer = await request(app, "GET", "/v1/models", headers=junk)
    beyond = await request(app, "GET", "/v1/models", headers=[(b"x-forwarded-for", b"10.9.9.9")])

    assert answer.status == 403
    assert answer.json()["error"] == {
        "message": "client address unknown is not in server.allowed_cidrs",
        "type": "forbidden",
        "code": "address_not_allowed",
    }
    assert beyond.status == 200
