"""The request examples of the OpenAPI document (proxy/api/examples.py): each names a model a
demo serves, and each answers on real nodes and from Swagger UI's "Try it out"."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proxy.api.examples import DEMO_CLUSTER, OPERATION_EXAMPLES, STANDALONE
from proxy.api.schema import openapi_document
from tests.browser import require_chromium
from tests.harness import REPO, Cluster, RouterNode, start_cluster, start_node, text_model

ARTIFACTS = REPO / "test-artifacts"
# What a new operator tries first: these must have examples.
CORE_OPERATIONS = {
    "openaiChat",
    "openaiCompletion",
    "openaiEmbeddings",
    "openaiImages",
    "ollamaChat",
    "ollamaGenerate",
    "koboldGenerate",
    "anthropicMessages",
    "responsesCreate",
}


def examples_by_operation() -> dict[str, tuple[str, str, dict[str, Any]]]:
    """operationId -> (path, method, the `examples` map of its JSON body)."""
    out = {}
    for path, operations in openapi_document()["paths"].items():
        for method, op in operations.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            if "examples" in body:
                out[op["operationId"]] = (path, method, body["examples"])
    return out


def demo_cluster_models() -> set[str]:
    # demo/ is a directory of scripts, not a package: load the demo cluster's own table.
    spec = importlib.util.spec_from_file_location("cluster_demo", REPO / "demo" / "cluster_demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {model for models in module.MODELS.values() for model in models}


def named_model(value: dict[str, Any]) -> str:
    model: str = value.get("model") or value["sd_model_checkpoint"]
    return model


def test_every_core_operation_has_an_example_for_a_demo_and_none_says_string() -> None:
    found = examples_by_operation()
    assert set(found) >= CORE_OPERATIONS, CORE_OPERATIONS - set(found)
    assert set(found) == set(OPERATION_EXAMPLES)
    for operation, (_, _, examples) in found.items():
        assert examples, operation
        assert '"string"' not in json.dumps(examples), operation
    # The demo cluster has text models only: its example is offered first where it has one.
    assert list(found["openaiChat"][2]) == [DEMO_CLUSTER, STANDALONE]
    assert list(found["openaiImages"][2]) == [STANDALONE]


def test_every_example_names_a_model_of_the_demo_it_is_for() -> None:
    cluster = demo_cluster_models()
    standalone = {p.stem for p in (REPO / "demo" / "kcpps").glob("*.kcpps")}
    for operation, (_, _, examples) in examples_by_operation().items():
        for demo, example in examples.items():
            models = cluster if demo == DEMO_CLUSTER else standalone
            assert named_model(example["value"]) in models, (operation, demo, example)
            assert named_model(example["value"]) in example["summary"]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    """A node as `./scripts/run` starts it: the simulated models of demo/kcpps."""
    n = start_node(
        tmp_path_factory.mktemp("examples-standalone"),
        [],
        models={"config_dir": str(REPO / "demo" / "kcpps")},
    )
    try:
        yield n
    finally:
        n.cleanup()


@pytest.fixture(scope="module")
def demo_like_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The demo cluster's text models under their names, on slaves behind a master."""
    c = start_cluster(
        tmp_path_factory.mktemp("examples-cluster"),
        [text_model("notes")],
        {"gpu-a": [text_model("chat")], "gpu-b": [text_model("chat-fast"), text_model("coder")]},
    )
    try:
        yield c
    finally:
        c.cleanup()


def answers(node: RouterNode, demo: str) -> dict[str, tuple[int, str]]:
    out = {}
    with node.client() as client:
        for operation, (path, method, examples) in examples_by_operation().items():
            if demo not in examples:
                continue
            response = client.request(method.upper(), path, json=examples[demo]["value"])
            out[operation] = (response.status_code, response.text[:300])
    return out


@pytest.mark.integration
def test_each_standalone_example_answers_on_the_built_in_demo_node(
    standalone: RouterNode,
) -> None:
    got = answers(standalone, STANDALONE)
    assert set(got) == set(OPERATION_EXAMPLES)
    assert {op: status for op, (status, _) in got.items() if status != 200} == {}, got


@pytest.mark.integration
def test_each_demo_cluster_example_answers_through_the_master(
    demo_like_cluster: Cluster,
) -> None:
    got = answers(demo_like_cluster.master, DEMO_CLUSTER)
    assert {op for op, (kind, _) in OPERATION_EXAMPLES.items() if kind == "text"} == set(got)
    assert {op: status for op, (status, _) in got.items() if status != 200} == {}, got


@pytest.mark.integration
def test_swagger_try_it_out_fills_a_demo_model_and_the_call_answers(
    standalone: RouterNode, request: pytest.FixtureRequest
) -> None:
    # Asked for here, not as an argument: the checks above run where there is no Chromium.
    require_chromium()
    new_page: Callable[..., Any] = request.getfixturevalue("new_page")
    tab = new_page(viewport={"width": 1280, "height": 900})
    tab.goto(standalone.base_url + "/router/v1/docs")
    block = tab.locator('.opblock:has(.opblock-summary-path[data-path="/v1/chat/completions"])')
    block.locator(".opblock-summary").first.click()
    block.locator(".try-out__btn").click()
    body = block.locator("textarea.body-param__text")
    body.wait_for()
    assert json.loads(body.input_value())["model"] == "chat"  # the demo cluster's, first
    block.locator(".examples-select select").first.select_option(STANDALONE)
    tab.wait_for_function(
        "el => el.value.includes('chat-small')", arg=body.element_handle(), polling=200
    )
    block.locator("button.execute").click()
    status = block.locator(".live-responses-table tbody .response-col_status").first
    status.wait_for()
    assert status.inner_text().strip().startswith("200"), status.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    block.screenshot(path=str(ARTIFACTS / "swagger-chat-try-it-out.png"))
