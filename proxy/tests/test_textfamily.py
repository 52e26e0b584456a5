"""The text family's pure parts: which lane `/v1/rerank` takes, and how answers are rewritten."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest

from proxy.families.text.surface import _EventRewriter, _KoboldEvents, _WholeRewriter, rerank_kind
from proxy.forwarding.rewrite import InvalidBackendJSON
from proxy.node import Node
from registry.cluster import Replica


def _node(**models: list[dict[str, Any]]) -> Node:
    by_public_id = {
        name: [Replica(name, f"n{i}", name, "http://n", True, rec) for i, rec in enumerate(recs)]
        for name, recs in models.items()
    }
    return cast(Node, SimpleNamespace(cluster=SimpleNamespace(by_public_id=by_public_id)))


EMBED_ONLY = {"has_embeddings": True, "has_llm": False}
TEXT_AND_EMBED = {"has_embeddings": True, "has_llm": True}


def test_rerank_goes_to_embeddings_only_for_a_model_that_only_embeds() -> None:
    node = _node(
        emb=[EMBED_ONLY],
        both=[TEXT_AND_EMBED],
        # One replica embeds only, another reads text: a text model.
        mixed=[EMBED_ONLY, {"has_embeddings": False, "has_llm": True}],
        gone=[{**EMBED_ONLY, "disabled": True}],
    )
    assert rerank_kind(node, "emb") == "embeddings"
    assert rerank_kind(node, "both") == "llm"
    assert rerank_kind(node, "mixed") == "llm"
    assert rerank_kind(node, "gone") == "llm"
    assert rerank_kind(node, "unknown") == "llm"
    assert rerank_kind(node, None) == "embeddings"
    assert rerank_kind(node, "") == "embeddings"
    assert rerank_kind(node, 5) == "llm"


def _sse(*docs: Any) -> bytes:
    return b"".join(b"event: x\ndata: " + orjson.dumps(d) + b"\n\n" for d in docs)


def test_stream_events_are_rewritten_nested_and_the_created_id_heard_once() -> None:
    heard: list[str] = []
    rewriter = _EventRewriter("public", heard.append)
    stream = (
        _sse(
            {"type": "response.created", "response": {"id": "r1", "model": "served"}},
            {"type": "response.output_text.delta", "delta": "hi"},
            {"type": "response.completed", "response": {"id": "r1", "model": "served"}},
            {"type": "message_start", "message": {"model": "served"}},
            {"model": "served", "choices": []},
        )
        + b"data: [DONE]\n\n"
    )
    # Split mid-line: lines are put back together before they are read.
    out = rewriter.feed(stream[:37]) + rewriter.feed(stream[37:]) + rewriter.close()
    assert b"served" not in out
    assert out.count(b'"model":"public"') == 4
    assert b"data: [DONE]\n\n" in out and out.count(b"event: x\n") == 5
    assert heard == ["r1"]


def test_an_event_needing_no_change_keeps_its_bytes() -> None:
    line = b'data:{"type":"x",  "model":"public"}\n\n'
    rewriter = _EventRewriter("public", None)
    assert rewriter.feed(line) + rewriter.close() == line


def test_a_whole_answer_is_rewritten_and_remembered_only_when_it_succeeded() -> None:
    heard: list[str] = []
    ok = _WholeRewriter("public", 200, heard.append)
    body = orjson.dumps({"id": "r2", "model": "served", "object": "response"})
    out = orjson.loads(ok.feed(body[:5]) + ok.feed(body[5:]) + ok.close())
    assert out["model"] == "public" and heard == ["r2"]
    failed = _WholeRewriter("public", 404, heard.append)
    error = orjson.dumps({"id": "r3", "model": "served"})
    assert orjson.loads(failed.feed(error) + failed.close())["model"] == "public"
    assert heard == ["r2"]
    broken = _WholeRewriter("public", 200, None)
    broken.feed(b"{nope")
    with pytest.raises(InvalidBackendJSON):
        broken.close()


def test_completion_chunks_become_kobold_token_events() -> None:
    events = _KoboldEvents()
    chunks = _sse(
        {"choices": [{"text": "once", "finish_reason": None}]},
        {"choices": [{"text": " upon", "finish_reason": "length"}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    )
    out = events.feed(chunks) + events.feed(b"data: [DONE]\n\n") + events.close()
    assert out == (
        b'event: message\ndata: {"token":"once","finish_reason":null}\n\n'
        b'event: message\ndata: {"token":" upon","finish_reason":"length"}\n\n'
    )
