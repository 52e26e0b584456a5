"""The media family's own rules: the default image model, the answer tap, ComfyUI outputs."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from proxy.families.media import handlers as media
from proxy.request import Ctx, Message
from proxy.serving.sticky import Holder, StickyIds
from registry.cluster import Replica
from routerproject.errors import RouterError


def image(public_id: str, *, disabled: bool = False) -> Replica:
    record = {"has_image": True, "image_id": public_id, "disabled": disabled}
    return Replica(public_id, "n1", public_id, "http://n1", True, record, None)


def node(*replicas: Replica, node_id: str = "n1") -> Any:
    by_id = {r.public_id: [r] for r in replicas}
    cluster = SimpleNamespace(by_public_image_id=by_id, by_public_id={}, view_ready=True)
    return SimpleNamespace(node_id=node_id, cluster=cluster, sticky=StickyIds())


@pytest.fixture(autouse=True)
def no_selection() -> Any:
    media._selected.clear()
    yield
    media._selected.clear()


def test_the_default_is_the_selection_then_the_only_model_then_the_first_by_id() -> None:
    assert media.default_image_model(node(image("b"), image("a", disabled=True))) == "b"
    two = node(image("b"), image("a"))
    assert media.default_image_model(two) == "a"
    media._selected["n1"] = "b"
    assert media.default_image_model(two) == "b"
    # A selection is this node's own; another node keeps its default.
    assert media.default_image_model(node(image("b"), image("a"), node_id="n2")) == "a"


def test_a_selection_no_longer_enabled_is_passed_over() -> None:
    media._selected["n1"] = "b"
    assert media.default_image_model(node(image("b", disabled=True), image("c"))) == "c"


def test_no_image_model_at_all_is_a_404() -> None:
    with pytest.raises(RouterError) as raised:
        media.default_image_model(node())
    assert raised.value.status == 404


def test_a_remembered_id_goes_to_its_holder_and_waits_for_it_when_it_is_gone() -> None:
    here = node(image("a"))
    here.sticky.remember("sdcpp", "job-1", Holder("n1", "a", "a"))
    found = media._holder_replica(here, "sdcpp", "job-1")
    assert found is not None and found.node_id == "n1"
    assert media._holder_replica(here, "sdcpp", "unknown") is None
    here.sticky.remember("sdcpp", "job-2", Holder("n9", "a", "a"))
    with pytest.raises(RouterError) as raised:
        media._holder_replica(here, "sdcpp", "job-2")
    # Not sent to another replica, which cannot know it; remembered for when n9 is back.
    assert (raised.value.status, raised.value.code) == (503, "node_unavailable")
    assert here.sticky.lookup("sdcpp", "job-2") == Holder("n9", "a", "a")


def run_tap(messages: list[Message], rewrite: Any = None) -> tuple[list[Message], media._Tap]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    ctx = Ctx({"headers": []}, receive, send, "/x", "GET")
    tap = media._Tap(ctx, rewrite)

    async def go() -> None:
        for message in messages:
            await ctx.send(message)

    asyncio.run(go())
    return sent, tap


def answer(status: int, body: bytes, ctype: bytes = b"application/json") -> list[Message]:
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
    return [
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": body[:3], "more_body": True},
        {"type": "http.response.body", "body": body[3:], "more_body": False},
    ]


def test_the_tap_keeps_a_json_answer_and_passes_it_unchanged() -> None:
    body = b'{"id": "job-1"}'
    sent, tap = run_tap(answer(200, body))
    assert sent == answer(200, body)
    assert tap.doc() == {"id": "job-1"}


def test_the_tap_keeps_no_error_and_no_other_content() -> None:
    assert run_tap(answer(404, b'{"id": "x"}'))[1].doc() is None
    assert run_tap(answer(200, b"PNG....", b"image/png"))[1].doc() is None


def test_a_rewriting_tap_sends_the_rewritten_answer_with_its_new_length() -> None:
    def public(doc: Any) -> Any:
        return {**doc, "sd_model_checkpoint": "the-public-id"}

    sent, _ = run_tap(answer(200, b'{"sd_model_checkpoint": "x"}'), public)
    start, body = sent
    assert body["more_body"] is False
    assert orjson.loads(body["body"]) == {"sd_model_checkpoint": "the-public-id"}
    assert dict(start["headers"])[b"content-length"] == str(len(body["body"])).encode()
    # An error is passed as it came.
    assert run_tap(answer(500, b'{"error": 1}'), public)[0] == answer(500, b'{"error": 1}')


def test_comfy_output_files_are_read_from_every_output() -> None:
    history = {
        "p1": {
            "outputs": {
                "9": {"images": [{"filename": "a.png"}, {"filename": "b.png"}]},
                "10": {"gifs": [{"filename": "c.webp"}], "text": ["not a file"]},
            }
        },
        "p2": {"outputs": "broken"},
    }
    assert media._output_files(history) == ["a.png", "b.png", "c.webp"]
    assert media._output_files(None) == []
