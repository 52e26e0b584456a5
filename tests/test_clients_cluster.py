"""The Anthropic SDK, unchanged, through a master to a model that only a slave holds: the
message, its event stream, a tool call, and errors in Anthropic's envelope from either node.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.harness import Cluster, start_cluster, text_model
from tests.lazy import LazyModule

if TYPE_CHECKING:
    import anthropic
else:
    anthropic = LazyModule("anthropic")


pytestmark = pytest.mark.integration

KEY = "sk-anthropic-clients"
HELLO: Any = [{"role": "user", "content": "hi"}]
TOOL: Any = {
    "name": "lookup",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("clients-cluster")
    c = start_cluster(
        root,
        [text_model("near")],
        {"s1": [text_model("far")]},
        master_sections={"auth": {"inference_keys": [KEY]}},
    )
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def claude(cluster: Cluster) -> Iterator[anthropic.Anthropic]:
    base = cluster.master.base_url
    # The SDK sends its key as `x-api-key`, which the router takes as the inference key.
    with anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0) as c:
        yield c


def test_a_slaves_model_answers_the_sdk_through_the_master(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model="far", max_tokens=16, messages=HELLO)
    assert (message.model, message.stop_reason) == ("far", "end_turn")
    with claude.messages.stream(model="far", max_tokens=16, messages=HELLO) as stream:
        assert list(stream.text_stream) == ["sim", " reply"]
        final = stream.get_final_message()
    assert (final.model, final.usage.output_tokens) == ("far", 2)
    with claude.messages.stream(model="far", max_tokens=16, messages=HELLO, tools=[TOOL]) as called:
        (block,) = called.get_final_message().content
    assert block.type == "tool_use" and (block.name, block.input) == ("lookup", {"q": "sim"})


def test_errors_through_the_master_are_in_anthropics_envelope(
    claude: anthropic.Anthropic,
) -> None:
    # The slave's backend refuses; the slave says so in Anthropic's envelope, kept as it is.
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="far", max_tokens=0, messages=HELLO)
    assert refused.value.type == "invalid_request_error"
    assert refused.value.api_message == "max_tokens: must be a positive integer"
    # The master's own 404 lists the cluster's models, the slave's included.
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="nope", max_tokens=8, messages=HELLO)
    assert missing.value.api_message == (
        'model "nope" was not found; the models here are: far, near'
    )
    assert missing.value.error_code == "model_not_found"


def test_a_wrong_key_is_refused_in_anthropics_envelope(cluster: Cluster) -> None:
    base = cluster.master.base_url
    with (
        anthropic.Anthropic(base_url=base, api_key="sk-wrong", max_retries=0) as wrong,
        pytest.raises(anthropic.AuthenticationError) as refused,
    ):
        wrong.messages.create(model="far", max_tokens=8, messages=HELLO)
    assert refused.value.type == "authentication_error"
    assert refused.value.api_message == "a valid inference key is required"
