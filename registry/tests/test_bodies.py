"""The model field of a request body passed on to another node's model."""

from __future__ import annotations

import orjson
import pytest

from registry.bodies import InvalidRequestJSON, set_body_model, set_image_body_model


def test_set_body_model_replaces_an_existing_model():
    out = set_body_model(b'{"model":"public-2","messages":[]}', "local")
    assert orjson.loads(out) == {"model": "local", "messages": []}


def test_set_body_model_inserts_a_missing_model():
    assert orjson.loads(set_body_model(b'{"prompt":"hi"}', "local")) == {
        "prompt": "hi",
        "model": "local",
    }


@pytest.mark.parametrize("body", [b"{", b"[1]", b'"model"'])
def test_set_body_model_rejects_a_body_that_is_not_a_json_object(body: bytes):
    with pytest.raises(InvalidRequestJSON):
        set_body_model(body, "local")


def test_set_body_model_keeps_every_other_byte_of_the_body():
    body = b'{"model": "owner-model", "messages": [{"role": "user", "content": "hi"}]}'

    out = set_body_model(body, "h")

    assert out == b'{"model": "h", "messages": [{"role": "user", "content": "hi"}]}'
    assert len(out) == len(body) - len("owner-model") + len("h")


def test_set_body_model_does_not_touch_a_nested_model_key():
    body = b'{"tools": [{"model": "A"}], "model": "A", "n": 1.50}'

    out = set_body_model(body, "B")

    assert out == b'{"tools": [{"model": "A"}], "model": "B", "n": 1.50}'


def test_set_body_model_re_serialises_when_the_id_is_written_with_escapes():
    body = b'{"model": "\\u0041", "prompt": "x"}'

    out = set_body_model(body, "B")

    assert orjson.loads(out) == {"model": "B", "prompt": "x"}


def test_an_image_body_names_the_served_model_in_each_checkpoint_field_that_named_the_public() -> (
    None
):
    body = orjson.dumps(
        {
            "prompt": "cat",
            "sd_model_checkpoint": " pub ",
            "override_settings": {"sd_model_checkpoint": "pub", "sampler": "Euler"},
        }
    )
    out = orjson.loads(set_image_body_model(body, "pub", "local"))
    assert out == {
        "prompt": "cat",
        "sd_model_checkpoint": "local",
        "override_settings": {"sd_model_checkpoint": "local", "sampler": "Euler"},
        "model": "local",
    }


def test_a_checkpoint_naming_another_model_is_left_alone() -> None:
    body = orjson.dumps({"model": "pub", "override_settings": {"sd_model_checkpoint": "other"}})
    out = orjson.loads(set_image_body_model(body, "pub", "local"))
    assert out == {"model": "local", "override_settings": {"sd_model_checkpoint": "other"}}
    same = orjson.dumps({"model": "pub", "sd_model_checkpoint": "pub"})
    assert set_image_body_model(same, "pub", "pub") == same
