"""The OpenAI SDK and the ollama client, unchanged, against a node in front of llama-server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from tests.harness import RouterNode
from tests_real.realnode import start_real_node

pytestmark = pytest.mark.integration

CHAT = "gemma"
EMBED = "gemma-embed"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def node(
    tmp_path_factory: pytest.TempPathFactory, llama_server: str, gguf: Path
) -> Iterator[RouterNode]:
    configs = {
        CHAT: {"model_param": str(gguf), "contextsize": 2048, "parallel": 1},
        EMBED: {
            "model_param": str(gguf),
            "contextsize": 1024,
            "embeddings": True,
            "extra_args": ["--pooling", "mean"],
        },
    }
    n = start_real_node(tmp_path_factory.mktemp("clients"), llama_server, configs)
    try:
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def sdk(node: RouterNode) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=node.base_url + "/v1", api_key="unused", timeout=300)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def olla(node: RouterNode) -> ollama.Client:
    return ollama.Client(host=node.base_url, timeout=300)


def test_the_openai_sdk_lists_chats_streams_and_completes(sdk: openai.OpenAI) -> None:
    assert {CHAT, EMBED} <= {m.id for m in sdk.models.list()}
    reply = sdk.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": PROMPT}], max_tokens=5
    )
    assert reply.model == CHAT and reply.choices[0].message.role == "assistant"
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 5
    chunks = list(
        sdk.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.model == CHAT for c in chunks)
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert 0 < last.usage.completion_tokens <= 5
    plain = list(
        sdk.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": PROMPT}], max_tokens=5, stream=True
        )
    )
    assert plain and all(c.usage is None for c in plain)
    text = sdk.completions.create(model=CHAT, prompt=PROMPT, max_tokens=5)
    assert text.model == CHAT and text.usage is not None and text.usage.completion_tokens <= 5


def test_the_openai_sdk_embeds_and_sees_errors_as_exceptions(sdk: openai.OpenAI) -> None:
    vectors = sdk.embeddings.create(model=EMBED, input=["a", "b c"])
    assert [len(d.embedding) for d in vectors.data] == [640, 640]
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": " ".join(["word"] * 4000)}],
            max_tokens=4,
        )
    assert info.value.status_code == 400


def test_the_ollama_client_chats_generates_streams_embeds_and_shows(
    olla: ollama.Client,
) -> None:
    names = {m.model for m in olla.list().models}
    assert {CHAT, EMBED} <= names
    reply = olla.chat(
        model=CHAT, messages=[{"role": "user", "content": PROMPT}], options={"num_predict": 5}
    )
    assert reply.model == CHAT and reply.done and reply.message.role == "assistant"
    assert reply.eval_count is not None and 0 < reply.eval_count <= 5
    assert reply.prompt_eval_count is not None and reply.prompt_eval_count > 0
    parts = list(
        olla.chat(
            model=CHAT,
            messages=[{"role": "user", "content": PROMPT}],
            options={"num_predict": 5},
            stream=True,
        )
    )
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert parts[-1].eval_count is not None and 0 < parts[-1].eval_count <= 5
    generated = olla.generate(model=CHAT, prompt=PROMPT, options={"num_predict": 5})
    assert generated.model == CHAT and generated.done
    embedded = olla.embed(model=EMBED, input=["a", "b c"])
    assert [len(v) for v in embedded.embeddings] == [640, 640]
    shown = olla.show(CHAT)
    assert shown.modelinfo is not None
    assert shown.modelinfo["llama_sdcpp.context_length"] == 2048
    with pytest.raises(ollama.ResponseError) as info:
        olla.chat(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 404


def test_a_request_right_after_a_stream_is_answered(olla: ollama.Client) -> None:
    # llama-server closes the connection after each stream although its answer says
    # keep-alive; a generate sent at once must not land on that dead pooled connection.
    for _ in range(10):
        parts = list(
            olla.chat(
                model=CHAT,
                messages=[{"role": "user", "content": PROMPT}],
                options={"num_predict": 2},
                stream=True,
            )
        )
        assert parts[-1].done
        generated = olla.generate(model=CHAT, prompt=PROMPT, options={"num_predict": 2})
        assert generated.done
