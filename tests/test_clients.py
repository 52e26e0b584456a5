"""The client libraries users already have, unchanged, against a real node.

The OpenAI SDK, the Anthropic SDK, the ollama client, LiteLLM, LangChain and plain HTTP for
Kobold talk to a standalone node whose models are simulated backends the router starts, and
upstream servers it does not start: one that serves a model only under its own name
(`Qwen/Qwen2.5-7B-Instruct`) and wants a key, one that answers under a name of its own whatever
it is asked, and one that reads images.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ollama
import pytest

from tests.harness import (
    ModelSpec,
    RouterNode,
    UpstreamServer,
    sim_weights,
    start_node,
    start_upstream,
    text_model,
    wait_for,
)
from tests.lazy import LazyModule

if TYPE_CHECKING:
    import anthropic
    import openai
else:
    anthropic = LazyModule("anthropic")
    openai = LazyModule("openai")


pytestmark = pytest.mark.integration

SERVED_NAME = "Qwen/Qwen2.5-7B-Instruct"
UPSTREAM_KEY = "sk-upstream-7c1e"
KEY_ENV = "ROUTER_TEST_UPSTREAM_KEY"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
PNG_1X1 = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
    )
).decode()


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, UpstreamServer]]:
    root = tmp_path_factory.mktemp("upstreams")
    started: dict[str, UpstreamServer] = {}
    try:
        started["qwen"] = start_upstream(
            root, "qwen", "-a", SERVED_NAME, "--sim-strict-model", "--api-key", UPSTREAM_KEY
        )
        started["own"] = start_upstream(root, "own", "-a", "its-own-name", "--sim-answer-as-alias")
        started["eye"] = start_upstream(root, "eye", "-a", "eye-served", vision=True)
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def node(
    tmp_path_factory: pytest.TempPathFactory, upstreams: dict[str, UpstreamServer]
) -> Iterator[RouterNode]:
    root = tmp_path_factory.mktemp("clients")
    key_file = root / "upstream.key"
    key_file.write_text(UPSTREAM_KEY + "\n")
    qwen = {"backend_mode": "upstream", "upstream_url": upstreams["qwen"].url}
    models = [
        text_model("chat"),
        ModelSpec("qwen", {**qwen, "upstream_model": SERVED_NAME, "upstream_api_key_env": KEY_ENV}),
        ModelSpec(
            "qwen-file",
            {**qwen, "upstream_model": SERVED_NAME, "upstream_api_key_file": str(key_file)},
        ),
        ModelSpec("own", {"backend_mode": "upstream", "upstream_url": upstreams["own"].url}),
        ModelSpec(
            "eye",
            {"backend_mode": "upstream", "upstream_url": upstreams["eye"].url, "vision": True},
        ),
        # The same server, its vision not declared: the router learns it from /v1/models.
        ModelSpec("eye-said", {"backend_mode": "upstream", "upstream_url": upstreams["eye"].url}),
        ModelSpec("painter", {}, {"sdmodel": sim_weights(image_ms_per_megapixel_step=1)}),
    ]
    n = start_node(root, models, extra_env={KEY_ENV: UPSTREAM_KEY})
    try:
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def oai(node: RouterNode) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=node.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
def claude(node: RouterNode) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=node.base_url, api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
def olla(node: RouterNode) -> ollama.Client:
    return ollama.Client(host=node.base_url, timeout=60)


# -- discovery -------------------------------------------------------------------------------


def test_the_openai_sdk_retrieves_a_model_and_gets_a_404_for_an_unknown_one(
    oai: openai.OpenAI,
) -> None:
    model = oai.models.retrieve("chat")
    assert (model.id, model.object, model.owned_by) == ("chat", "model", "router")
    listed = {m.id for m in oai.models.list()}
    assert {"chat", "qwen", "own", "eye"} <= listed
    with pytest.raises(openai.NotFoundError) as missing:
        oai.models.retrieve("nope")
    assert missing.value.status_code == 404
    error = missing.value.body
    assert isinstance(error, dict) and error["code"] == "model_not_found"
    # The answer lists the models that exist, as Ollama's does.
    assert error["message"] == (
        'model "nope" was not found; the models here are: chat, eye, eye-said, own, qwen, qwen-file'
    )


def test_kobold_clients_discover_the_server_and_its_model(node: RouterNode) -> None:
    with node.client() as client:
        version = client.get("/api/extra/version").json()
        assert version["result"] == "KoboldCpp" and version["version"]
        # The node has an image model and a vision model, no transcription.
        assert (version["txt2img"], version["vision"], version["transcribe"]) == (
            True,
            True,
            False,
        )
        body = {"prompt": "Once", "max_length": 3}
        assert client.post("/api/v1/generate", json={**body, "model": "chat"}).status_code == 200
        # Kobold clients send no model: the one they see is the one generate then runs.
        assert client.get("/api/v1/model").json() == {"result": "koboldcpp/chat"}
        generated = client.post("/api/v1/generate", json=body)
        assert generated.status_code == 200
        assert generated.json()["results"][0]["text"]


# -- upstream_model, keys and the answer's model ---------------------------------------------


def test_an_upstream_gets_the_name_it_serves_and_the_client_sees_the_id_it_asked_for(
    oai: openai.OpenAI, upstreams: dict[str, UpstreamServer]
) -> None:
    before = len(upstreams["qwen"].stats()["requests"])
    for model in ("qwen", "qwen-file"):
        answer = oai.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert answer.model == model and answer.choices[0].message.content
        chunks = list(
            oai.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                stream=True,
            )
        )
        assert chunks and {c.model for c in chunks} == {model}
    seen = upstreams["qwen"].stats()["requests"][before:]
    # The upstream refuses any other name (404) and any request without its key (401): each
    # of the four reached it under its served name, with the key from the env or the file.
    assert [r["model"] for r in seen] == [SERVED_NAME] * 4


def test_the_upstream_key_is_never_shown(node: RouterNode) -> None:
    with node.client() as client:
        records = client.get("/router/v1/models").text
    assert UPSTREAM_KEY not in records
    assert UPSTREAM_KEY not in node.output()


def test_an_upstream_answering_under_its_own_name_is_rewritten_everywhere(
    oai: openai.OpenAI, olla: ollama.Client, node: RouterNode
) -> None:
    answer = oai.chat.completions.create(
        model="own", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert answer.model == "own"
    chunks = list(oai.completions.create(model="own", prompt="Once", max_tokens=3, stream=True))
    assert len(chunks) >= 3 and {c.model for c in chunks} == {"own"}
    vector = oai.embeddings.create(model="own", input="hello")
    assert vector.model == "own"
    assert olla.chat(model="own", messages=[{"role": "user", "content": "hi"}]).model == "own"
    with node.client() as client:
        raw = client.post(
            "/v1/chat/completions",
            json={"model": "own", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ).text
    assert "its-own-name" not in raw


# -- Ollama tool calling ---------------------------------------------------------------------


def test_the_ollama_client_round_trips_a_tool_call(olla: ollama.Client) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = olla.chat(model="chat", messages=messages, tools=[WEATHER_TOOL], stream=False)
    calls = first.message.tool_calls or []
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "sim", "days": 1})
    ]
    assert first.done and first.done_reason == "stop"
    # The client sends the call back in the history and the tool's answer after it; the
    # backend refuses a tool result that names no earlier call, so an answer proves both
    # were translated.
    messages += [first.message, {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    second = olla.chat(model="chat", messages=messages, tools=[WEATHER_TOOL], stream=False)
    assert second.message.content and not second.message.tool_calls


def test_the_ollama_client_gets_streamed_tool_calls_whole(olla: ollama.Client) -> None:
    parts = list(
        olla.chat(
            model="chat",
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[WEATHER_TOOL],
            stream=True,
        )
    )
    with_calls = [p for p in parts if p.message.tool_calls]
    assert len(with_calls) == 1
    (call,) = with_calls[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert dict(call.function.arguments) == {"city": "sim", "days": 1}
    assert parts[-1].done and not any(p.done for p in parts[:-1])


def test_ollama_show_lists_tools_and_vision(olla: ollama.Client) -> None:
    assert "tools" in (olla.show("chat").capabilities or [])
    eye = olla.show("eye").capabilities or []
    assert "vision" in eye and "tools" in eye


def test_keep_alive_zero_unloads_and_an_empty_request_loads(
    olla: ollama.Client, node: RouterNode
) -> None:
    def loaded() -> set[str]:
        return {m.model for m in olla.ps().models if m.model}

    load = olla.generate(model="chat")
    assert (load.done, load.done_reason) == (True, "load")
    assert "chat" in loaded()
    answer = olla.chat(model="chat", messages=[{"role": "user", "content": "hi"}], keep_alive=0)
    assert answer.message.content
    wait_for(lambda: "chat" not in loaded(), timeout=20)
    olla.generate(model="chat")
    unload = olla.chat(model="chat", messages=[], keep_alive="0s")
    assert (unload.done, unload.done_reason) == (True, "unload")
    assert "chat" not in loaded()


def test_unknown_ollama_paths_answer_in_ollamas_error_shape(node: RouterNode) -> None:
    with node.client() as client:
        for method, path in (
            ("POST", "/api/pull"),
            ("GET", "/api/nothing"),
            ("DELETE", "/api/delete"),
        ):
            resp = client.request(method, path, json={"model": "chat"})
            assert resp.status_code == 404, path
            assert set(resp.json()) == {"error"} and path in resp.json()["error"]


def test_a_bad_tool_history_is_refused_naming_the_field(node: RouterNode) -> None:
    body = {
        "model": "chat",
        "stream": False,
        "messages": [{"role": "tool", "content": "sunny", "tool_name": "get_weather"}],
    }
    with node.client() as client:
        resp = client.post("/api/chat", json=body)
        assert resp.status_code == 400
        assert "messages[0]" in resp.json()["error"]
        bad_think = client.post("/api/chat", json={**body, "messages": [], "think": "lots"})
        assert bad_think.status_code == 400 and "think" in bad_think.json()["error"]


# -- vision and images -----------------------------------------------------------------------


def test_a_config_that_declares_vision_gets_the_image(
    olla: ollama.Client, oai: openai.OpenAI
) -> None:
    answer = olla.chat(
        model="eye", messages=[{"role": "user", "content": "What is this?", "images": [PNG_1X1]}]
    )
    assert answer.message.content and answer.model == "eye"
    url = f"data:image/png;base64,{PNG_1X1}"
    chat = oai.chat.completions.create(
        model="eye",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
        max_tokens=2,
    )
    assert chat.model == "eye"


def test_asking_a_chat_model_for_an_image_says_it_makes_none(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        oai.images.generate(model="chat", prompt="a cat")
    assert refused.value.status_code == 404
    message = refused.value.body["message"]
    assert message.startswith('model "chat" was not found') and "makes no images" in message
    with pytest.raises(openai.NotFoundError) as unknown:
        oai.images.generate(model="nope", prompt="a cat")
    # The image models are listed, by the names requests use.
    expected = 'model "nope" was not found; the models here are: painter'
    assert unknown.value.body["message"] == expected


def test_kobold_discovery_needs_the_inference_key_like_every_client_path(
    tmp_path: Path,
) -> None:
    key = "sk-inference-1"
    with_key = start_node(tmp_path, [text_model("solo")], auth={"inference_keys": [key]})
    try:
        with with_key.client() as client:
            assert client.get("/api/extra/version").status_code == 401
            headers = {"Authorization": f"Bearer {key}"}
            version = client.get("/api/extra/version", headers=headers).json()
            assert version["protected"] is True
            # One text model: it is the one a Kobold client's generate runs, loaded or not.
            model = client.get("/api/v1/model", headers=headers).json()
            assert model == {"result": "koboldcpp/solo"}
            assert json.loads(client.get("/v1/models/solo", headers=headers).text)["id"] == "solo"
    finally:
        with_key.cleanup()


def test_vision_an_upstream_reports_is_learnt_and_a_text_only_one_keeps_refusing_images(
    olla: ollama.Client, node: RouterNode
) -> None:
    def capabilities(model: str) -> list[str]:
        return list(olla.show(model).capabilities or [])

    # Asked at start, beside everything else: polled, not assumed done.
    wait_for(lambda: "vision" in capabilities("eye-said"), timeout=20)
    image = {"role": "user", "content": "What is this?", "images": [PNG_1X1]}
    assert olla.chat(model="eye-said", messages=[image]).message.content
    assert "vision" not in capabilities("own")
    with node.client() as client:
        refused = client.post("/api/chat", json={"model": "own", "messages": [image]})
    assert refused.status_code == 400 and "image" in refused.json()["error"]


# -- the Anthropic SDK -----------------------------------------------------------------------


def request_row(node: RouterNode, request_id: str) -> dict[str, Any] | None:
    """The node's analytics row of a request, once it is flushed."""
    with node.client() as client:
        params: dict[str, str | int] = {"kind": "requests", "limit": 500}
        records = client.get("/router/v1/site/analytics", params=params).json()["records"]
    found = [r for r in records if r.get("request_id") == request_id]
    return found[0] if found else None


ANTHROPIC_WEATHER_TOOL: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}


def test_the_anthropic_sdk_creates_a_message(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model="chat", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    assert (message.model, message.role, message.stop_reason) == ("chat", "assistant", "end_turn")
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", "sim reply")]
    assert message.usage.output_tokens == 2


def test_the_anthropic_sdk_streams_a_message_event_by_event(
    claude: anthropic.Anthropic, node: RouterNode
) -> None:
    with claude.messages.stream(
        model="chat",
        max_tokens=16,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Request-Id": "anthropic-stream-1"},
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert pieces == ["sim", " reply"]
    assert final.model == "chat" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 2
    # The stream's usage reaches the node's analytics (and a key's tpm) whole.
    row = wait_for(lambda: request_row(node, "anthropic-stream-1"), timeout=30)
    assert (row["prompt_tokens"], row["output_tokens"]) == (1, 2)
    # A budget shorter than the reply ends it by max_tokens, which the closing delta says.
    with claude.messages.stream(
        model="chat", max_tokens=1, messages=[{"role": "user", "content": "hi"}]
    ) as short:
        assert "".join(short.text_stream) == "sim"
        assert short.get_final_message().stop_reason == "max_tokens"


def test_the_anthropic_sdk_round_trips_a_tool_call(claude: anthropic.Anthropic) -> None:
    question: Any = {"role": "user", "content": "What is the weather in Paris?"}
    first = claude.messages.create(
        model="chat", max_tokens=64, messages=[question], tools=[ANTHROPIC_WEATHER_TOOL]
    )
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert (call.name, call.input) == ("get_weather", {"city": "sim", "days": 1})
    result: Any = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
    }
    history: Any = [question, {"role": "assistant", "content": first.content}, result]
    second = claude.messages.create(
        model="chat", max_tokens=64, messages=history, tools=[ANTHROPIC_WEATHER_TOOL]
    )
    assert second.stop_reason == "end_turn" and second.content[0].type == "text"
    # Streamed, the call's input arrives as JSON pieces the SDK joins.
    with claude.messages.stream(
        model="chat", max_tokens=64, messages=[question], tools=[ANTHROPIC_WEATHER_TOOL]
    ) as stream:
        streamed = stream.get_final_message()
    (streamed_call,) = [b for b in streamed.content if b.type == "tool_use"]
    assert streamed_call.input == {"city": "sim", "days": 1}
    assert streamed.stop_reason == "tool_use"


def test_the_anthropic_sdk_reads_errors_from_anthropics_envelope(
    claude: anthropic.Anthropic,
) -> None:
    hello: Any = [{"role": "user", "content": "hi"}]
    # The router's own 404, with the stable code where the SDK reads it.
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="nope", max_tokens=8, messages=hello)
    assert missing.value.type == "not_found_error"
    assert missing.value.error_code == "model_not_found"
    assert missing.value.api_message is not None
    assert missing.value.api_message.startswith('model "nope" was not found; the models here are:')
    assert "chat" in missing.value.api_message
    # The router's own 400, naming the field.
    with pytest.raises(anthropic.BadRequestError) as no_model:
        claude.messages.create(model="", max_tokens=8, messages=hello)
    assert (no_model.value.type, no_model.value.api_message) == (
        "invalid_request_error",
        "model is required",
    )
    body = no_model.value.body
    assert isinstance(body, dict) and body["error"]["details"]["param"] == "model"
    # The backend's own refusal, which it answers in OpenAI's envelope, arrives in Anthropic's.
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="chat", max_tokens=0, messages=hello)
    assert refused.value.type == "invalid_request_error"
    assert refused.value.api_message == "max_tokens: must be a positive integer"
    # Streams are refused the same way before any event.
    with (
        pytest.raises(anthropic.NotFoundError) as streamed,
        claude.messages.stream(model="nope", max_tokens=8, messages=hello) as stream,
    ):
        stream.get_final_message()
    assert streamed.value.type == "not_found_error"


# -- LiteLLM and LangChain -------------------------------------------------------------------


def _litellm() -> Any:
    # Its model price table would be fetched from the network at import: the packaged copy.
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm

    litellm.telemetry = False
    return litellm


def test_litellm_completes_streams_and_reads_a_404(node: RouterNode) -> None:
    litellm = _litellm()
    common = {
        "api_base": node.base_url + "/v1",
        "api_key": "unused",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "num_retries": 0,
    }
    answer = litellm.completion(model="openai/chat", **common)
    said = answer.choices[0].message.content
    assert said and answer.usage.completion_tokens > 0
    pieces = litellm.completion(model="openai/chat", stream=True, **common)
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == said
    with pytest.raises(litellm.NotFoundError) as missing:
        litellm.completion(model="openai/no-such-model", **common)
    assert "the models here are" in str(missing.value)


def test_langchain_invokes_streams_and_binds_a_tool(node: RouterNode) -> None:
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    llm = ChatOpenAI(
        base_url=node.base_url + "/v1",
        api_key=SecretStr("unused"),
        model="chat",
        max_completion_tokens=16,
        max_retries=0,
    )
    said = llm.invoke("hi").content
    assert isinstance(said, str) and said
    assert "".join(str(chunk.content) for chunk in llm.stream("hi")) == said
    weather = {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    reply = llm.bind_tools([{"type": "function", "function": weather}]).invoke("weather in Oslo?")
    assert [call["name"] for call in reply.tool_calls] == ["weather"], reply
