from __future__ import annotations

from typing import Any

import pytest

from guardians.detect import body_has_image


def test_openai_chat_image_url_part_is_an_image() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
        ]
    }
    assert body_has_image(body)


def test_responses_input_image_item_is_an_image() -> None:
    body = {"input": [{"type": "input_image", "image_url": "https://example.invalid/a.png"}]}
    assert body_has_image(body)


def test_responses_input_image_inside_a_message_is_an_image() -> None:
    body = {
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "describe"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                ],
            }
        ]
    }
    assert body_has_image(body)


def test_anthropic_image_block_is_an_image() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
                    {"type": "text", "text": "what is this?"},
                ],
            }
        ]
    }
    assert body_has_image(body)


def test_anthropic_image_inside_a_tool_result_is_an_image() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "image", "source": {"type": "base64", "data": "A"}}],
                    }
                ],
            }
        ]
    }
    assert body_has_image(body)


def test_ollama_message_images_are_an_image() -> None:
    body = {"messages": [{"role": "user", "content": "what is this?", "images": ["AAAA"]}]}
    assert body_has_image(body)


def test_ollama_generate_top_level_images_are_an_image() -> None:
    assert body_has_image({"prompt": "describe", "images": ["AAAA"]})


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "please send an image_url and input_image"}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": '"type":"image_url"'}]}
            ]
        },
        {"prompt": '{"type": "image_url"}'},
        {"input": "an image of type input_image"},
        {"input": ["image_url", "image"]},
        {"messages": [{"role": "user", "content": "hi", "images": []}]},
        {"images": []},
        {"messages": [{"role": "assistant", "content": [{"type": "text", "text": "image"}]}]},
    ],
)
def test_text_that_merely_mentions_images_is_not_an_image(body: dict[str, Any]) -> None:
    assert not body_has_image(body)


@pytest.mark.parametrize(
    "body",
    [
        None,
        "image_url",
        42,
        ["image_url"],
        {"messages": "image_url"},
        {"messages": [None, 3, "x", ["image_url"]]},
        {"messages": [{"content": {"type": "image_url"}}]},
        {"messages": [{"content": [None, 1, "image_url", {"type": ["image_url"]}]}]},
        {"messages": [{"images": "AAAA"}]},
        {"images": "AAAA"},
        {"input": [None, {"content": "input_image"}, {"type": {"x": 1}}]},
        {"messages": [{"content": [{"type": "tool_result", "content": "image"}]}]},
    ],
)
def test_junk_shapes_never_raise_and_hold_no_image(body: Any) -> None:
    assert body_has_image(body) is False
