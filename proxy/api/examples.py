"""Request examples for the inference operations of the OpenAPI document: what Swagger UI's
"Try it out" fills in.

Without them Swagger UI built a body from the schema, `"model": "string"`, which every router
refuses. Each example names a model one of the two demos serves, so a new operator's first try
answers: the demo cluster (`./scripts/demo`, demo/cluster_demo.py: text models only) and the
built-in standalone node (`./scripts/run`, the models in demo/kcpps). An operation gets one
example per demo that has a model of its kind, the demo cluster's first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["DEMO_MODELS", "OPERATION_EXAMPLES", "add_request_examples"]

Body = dict[str, Any]

DEMO_CLUSTER = "demo-cluster"
STANDALONE = "standalone-demo"
DEMO_SUMMARIES = {
    DEMO_CLUSTER: "The demo cluster (./scripts/demo)",
    STANDALONE: "The built-in standalone node (./scripts/run, demo/kcpps)",
}
# Per kind of model, the one each demo serves (a demo without one of that kind is left out).
DEMO_MODELS: dict[str, dict[str, str]] = {
    "text": {DEMO_CLUSTER: "chat", STANDALONE: "chat-small"},
    "image": {STANDALONE: "image-sd"},
}
HELLO = "Say hello in five words."
MESSAGES = [{"role": "user", "content": HELLO}]
PROMPT = "Once upon a time"
TEXT_TOKENS = 32


def _text(build: Callable[[str], Body]) -> tuple[str, Callable[[str], Body]]:
    return "text", build


def _image(build: Callable[[str], Body]) -> tuple[str, Callable[[str], Body]]:
    return "image", build


# operationId -> (kind of model, body naming that model). Operations the demos cannot answer
# (reranking, scoring, speech, uploads) keep the schema's own rendering.
OPERATION_EXAMPLES: dict[str, tuple[str, Callable[[str], Body]]] = {
    "openaiChat": _text(lambda m: {"model": m, "messages": MESSAGES, "max_tokens": TEXT_TOKENS}),
    "openaiCompletion": _text(lambda m: {"model": m, "prompt": PROMPT, "max_tokens": TEXT_TOKENS}),
    "openaiEmbeddings": _text(lambda m: {"model": m, "input": "The quick brown fox"}),
    "responsesCreate": _text(lambda m: {"model": m, "input": HELLO}),
    "responsesInputTokens": _text(lambda m: {"model": m, "input": HELLO}),
    "anthropicMessages": _text(
        lambda m: {"model": m, "max_tokens": TEXT_TOKENS, "messages": MESSAGES}
    ),
    "anthropicCountTokens": _text(lambda m: {"model": m, "messages": MESSAGES}),
    "ollamaChat": _text(lambda m: {"model": m, "messages": MESSAGES, "stream": False}),
    "ollamaGenerate": _text(lambda m: {"model": m, "prompt": PROMPT, "stream": False}),
    "ollamaEmbed": _text(lambda m: {"model": m, "input": "The quick brown fox"}),
    "ollamaEmbeddings": _text(lambda m: {"model": m, "prompt": "The quick brown fox"}),
    "ollamaShow": _text(lambda m: {"model": m}),
    "koboldGenerate": _text(lambda m: {"model": m, "prompt": PROMPT, "max_length": TEXT_TOKENS}),
    "koboldGenerateStream": _text(
        lambda m: {"model": m, "prompt": PROMPT, "max_length": TEXT_TOKENS}
    ),
    "openaiImages": _image(
        lambda m: {"model": m, "prompt": "a red fox in the snow", "size": "512x512", "n": 1}
    ),
    "sdTxt2Img": _image(
        lambda m: {
            "prompt": "a red fox in the snow",
            "width": 512,
            "height": 512,
            "steps": 20,
            "sd_model_checkpoint": m,
        }
    ),
}


def operation_examples(operation_id: str) -> dict[str, Any]:
    """The OpenAPI `examples` map of one operation's JSON body: one per demo with a model of
    its kind; empty for an operation without examples."""
    found = OPERATION_EXAMPLES.get(operation_id)
    if found is None:
        return {}
    kind, build = found
    return {
        demo: {"summary": f"{DEMO_SUMMARIES[demo]}: {model}", "value": build(model)}
        for demo, model in DEMO_MODELS[kind].items()
    }


def add_request_examples(paths: dict[str, Any]) -> None:
    """Put the examples into the JSON request bodies of `paths` (the merged document's)."""
    for operations in paths.values():
        for operation in operations.values():
            if not isinstance(operation, dict):
                continue
            examples = operation_examples(str(operation.get("operationId", "")))
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if examples and body is not None:
                body["examples"] = examples
