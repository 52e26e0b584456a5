"""The voice family's rules on their own: selectors, audio checks, the realtime relay's
refusals, frame rewriting and close codes (the whole paths run in tests/test_family_voice.py
and tests/test_realtime.py)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import wave
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from asgiref.testing import ApplicationCommunicator
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from proxy.edge.gate import inference_token
from proxy.edge.realtime import RealtimeApp, Session, sendable
from proxy.families.voice.handlers import _kobold_audio, _with_query_model, named_model, speaker_for
from proxy.node import Node, build_node
from proxy.request import Ctx
from proxy.sim.voice import speech_wav
from proxy.tests.test_ws_protocol import serve
from registry.httpclient import close_session
from routerproject.config import load_config
from routerproject.errors import RouterError

KEY = "voice-unit-key"
TOKEN = "voice-unit-cluster-token-0123456789"
WEIGHTS = {"load_ms": 1, "base_ms": 1, "prompt_ms_per_token": 0, "output_ms_per_token": 0}
MESSAGE_TIMEOUT_SECS = 10.0

NodeFactory = Callable[..., Node]


@pytest.fixture
async def make_node(tmp_path: Path) -> AsyncIterator[NodeFactory]:
    nodes: list[Node] = []

    def factory(*speakers: str, **sections: Any) -> Node:
        root = tmp_path / f"node{len(nodes)}"
        kcpps, weights = root / "kcpps", root / "weights"
        kcpps.mkdir(parents=True)
        weights.mkdir()
        (weights / "w.sim.json").write_text(json.dumps(WEIGHTS))
        for name in speakers:
            raw = {
                "backend_mode": "sim",
                "model_param": "../weights/w.sim.json",
                "ttsmodel": "../weights/w.sim.json",
            }
            (kcpps / f"{name}.kcpps").write_text(json.dumps(raw))
        doc: dict[str, Any] = {
            "server": {"bind": "127.0.0.1:18997"},
            "cluster": {"node_id": "voice-unit", "store_dir": str(root / "store")},
            "models": {"config_dir": str(kcpps)},
            "backend": {"mode": "sim"},
            **sections,
        }
        (root / "config.yaml").write_text(yaml.safe_dump(doc))
        node = build_node(load_config(root / "config.yaml", environ={}))
        nodes.append(node)
        return node

    try:
        yield factory
    finally:
        for node in nodes:
            await node.runtimes.close()
        await close_session()


def _ctx(query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> Ctx:
    scope = {"type": "http", "query_string": query, "headers": headers or []}

    async def nothing(*_: Any) -> Any:
        return None

    return Ctx(scope, nothing, nothing, "/v1/audio/voices", "GET")


def _wav() -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x00" * 800)
    return buf.getvalue()


# -- selectors and audio --------------------------------------------------------------------


def test_the_body_names_the_model_before_the_query_and_the_header() -> None:
    ctx = _ctx(b"model=q&x=1", [(b"x-tensors-model", b"h")])
    assert named_model(ctx, {"model": "b"}) == "b"
    assert named_model(ctx, {}) == "q"
    assert named_model(_ctx(b"", [(b"x-tensors-model", b" h ")]), {}) == "h"
    assert named_model(_ctx(b"model="), None) is None


async def test_without_a_model_only_a_single_speaker_is_chosen(make_node: NodeFactory) -> None:
    assert speaker_for(_ctx(), make_node("one")) == "one"
    with pytest.raises(RouterError) as refused:
        speaker_for(_ctx(), make_node("one", "two"))
    assert (refused.value.status, refused.value.param) == (400, "model")
    with pytest.raises(RouterError):
        speaker_for(_ctx(), make_node())


def test_kobold_audio_must_be_base64_wav() -> None:
    wav = _wav()
    assert _kobold_audio({"audio_data": base64.b64encode(wav).decode()}) == wav
    data_url = "data:audio/wav;base64," + base64.b64encode(wav).decode()
    assert _kobold_audio({"audio_data": data_url}) == wav
    for bad in (None, "", "%%%", base64.b64encode(b"OggS0000").decode()):
        with pytest.raises(RouterError) as refused:
            _kobold_audio({"audio_data": bad})
        assert (refused.value.status, refused.value.param) == (400, "audio_data")


def test_the_query_model_is_replaced_and_the_rest_kept() -> None:
    assert _with_query_model("model=pub&voice=a", "local") == "model=local&voice=a"
    assert _with_query_model("", "local") == "model=local"


def test_the_simulated_speech_is_a_valid_wav() -> None:
    with wave.open(io.BytesIO(speech_wav())) as clip:
        assert clip.getnframes() > 0 and clip.getframerate() > 0


# -- keys -------------------------------------------------------------------------------------


def test_the_key_comes_from_the_bearer_header_or_the_browser_subprotocol() -> None:
    def lookup(headers: dict[bytes, bytes]) -> Callable[[bytes], bytes | None]:
        return headers.get

    assert inference_token(lookup({b"authorization": b"Bearer k1"})) == b"k1"
    offered = b"realtime, openai-insecure-api-key.k2, openai-beta.realtime-v1"
    assert inference_token(lookup({b"sec-websocket-protocol": offered})) == b"k2"
    assert inference_token(lookup({b"sec-websocket-protocol": b"realtime"})) == b""
    assert inference_token(lookup({})) == b""


# -- frames and close codes ---------------------------------------------------------------------


def test_backend_frames_name_the_public_model() -> None:
    session = Session("talk-2", "talk")
    out = json.loads(session.rewrite('{"model":"talk","session":{"model":"talk"},"x":"talk"}'))
    assert out == {"model": "talk-2", "session": {"model": "talk-2"}, "x": "talk"}
    for untouched in ("not json", '["model"]', '{"model":"other"}', '{"echo":"hi"}'):
        assert session.rewrite(untouched) == untouched
    inward = json.loads(session.inward('{"type":"session.update","session":{"model":"talk-2"}}'))
    assert inward == {"type": "session.update", "session": {"model": "talk"}}
    same = Session("talk", "talk")
    assert same.rewrite('{"model":"talk"}') == '{"model":"talk"}'


@pytest.mark.parametrize("code", [1000, 1001, 1003, 1008, 1011, 3000, 4001, 4999])
def test_codes_a_close_frame_may_carry_pass(code: int) -> None:
    assert sendable(code) == code


@pytest.mark.parametrize("code", [None, 999, 1004, 1005, 1006, 1015, 2000, 5000])
def test_codes_no_close_frame_may_carry_are_replaced(code: int | None) -> None:
    assert sendable(code) == 1001
    assert sendable(code, fallback=1011) == 1011


async def test_a_session_that_cannot_start_is_told_why_on_a_real_socket(
    make_node: NodeFactory,
) -> None:
    # The whole answer through the node's WebSocket protocol: the error event, then the close
    # with 4000 + the status and the message as its reason.
    node = make_node("talk", auth={"inference_keys": [KEY]})
    async with serve(RealtimeApp(node_getter=lambda: node)) as served:
        url = served.url + "/v1/realtime?model=nope"
        async with connect(url, subprotocols=[Subprotocol(f"openai-insecure-api-key.{KEY}")]) as ws:
            event = orjson.loads(await asyncio.wait_for(ws.recv(), MESSAGE_TIMEOUT_SECS))
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), MESSAGE_TIMEOUT_SECS)
        await served.until_released()
    assert event["type"] == "error" and "was not found" in event["error"]["message"]
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4404
    assert closed.value.rcvd.reason == event["error"]["message"][:120]
    assert served.releases == 1


async def test_a_session_without_the_key_is_an_http_403_on_a_real_socket(
    make_node: NodeFactory,
) -> None:
    node = make_node("talk", auth={"inference_keys": [KEY]})
    async with serve(RealtimeApp(node_getter=lambda: node)) as served:
        with pytest.raises(InvalidStatus) as refused:
            await connect(served.url + "/v1/realtime?model=talk")
        await served.until_released()
    assert refused.value.response.status_code == 403
    assert served.releases == 1


# -- the relay's refusals ---------------------------------------------------------------------


async def _open(
    node: Node, path: str, *, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
) -> list[dict[str, Any]]:
    app = RealtimeApp(node_getter=lambda: node)
    scope = {
        "type": "websocket",
        "path": path,
        "query_string": query,
        "headers": headers or [],
        "subprotocols": [],
        "client": ("127.0.0.1", 5000),
    }
    comm = ApplicationCommunicator(app, scope)
    await comm.send_input({"type": "websocket.connect"})
    await comm.wait(MESSAGE_TIMEOUT_SECS)
    out = []
    while not comm.output_queue.empty():
        out.append(comm.output_queue.get_nowait())
    return out


def _bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


async def test_a_session_without_the_key_is_refused_before_accept(make_node: NodeFactory) -> None:
    node = make_node("talk", auth={"inference_keys": [KEY]})
    for headers in ([], _bearer("wrong")):
        out = await _open(node, "/v1/realtime", query=b"model=talk", headers=headers)
        assert [m["type"] for m in out] == ["websocket.close"]


async def test_only_the_realtime_paths_are_websockets(make_node: NodeFactory) -> None:
    out = await _open(make_node("talk"), "/v1/chat/completions", query=b"model=talk")
    assert [m["type"] for m in out] == ["websocket.close"]


async def test_the_node_route_needs_the_cluster_token(make_node: NodeFactory) -> None:
    path = "/router/v1/node/inference/v1/realtime"
    standalone = make_node("talk")
    out = await _open(standalone, path, query=b"model=talk", headers=_bearer(TOKEN))
    assert [m["type"] for m in out] == ["websocket.close"]


@pytest.mark.parametrize(
    ("query", "code", "says"),
    [(b"", 4400, "model is required"), (b"model=nope", 4404, "was not found")],
)
async def test_a_session_that_cannot_start_is_told_why(
    make_node: NodeFactory, query: bytes, code: int, says: str
) -> None:
    node = make_node("talk", auth={"inference_keys": [KEY]})
    headers = [(b"sec-websocket-protocol", f"openai-insecure-api-key.{KEY}".encode())]
    out = await _open(node, "/v1/realtime", query=query, headers=headers)
    assert [m["type"] for m in out] == ["websocket.accept", "websocket.send", "websocket.close"]
    event = orjson.loads(out[1]["text"])
    assert event["type"] == "error" and says in event["error"]["message"]
    assert out[2]["code"] == code
