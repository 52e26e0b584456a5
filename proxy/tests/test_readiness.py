"""Readiness rules per lane (reference-cluster §3.2), as proxy/runtimes/readiness.py has them."""

from __future__ import annotations

import orjson
import pytest

from proxy.runtimes.readiness import (
    health_ready,
    is_ready,
    kobold_flag_ready,
    models_ready,
    probe_path,
    reported_vision,
    sd_models_ready,
)


def _json(doc: object) -> bytes:
    return orjson.dumps(doc)


LLAMA_MODELS = _json({"object": "list", "data": [{"id": "chat-small", "object": "model"}]})
SD_MODELS = _json([{"title": "image-sd", "model_name": "image-sd"}])


@pytest.mark.parametrize(
    ("probe", "path"),
    [
        ("models", "/v1/models"),
        ("sd_models", "/sdapi/v1/sd-models"),
        ("health", "/health"),
        ("kobold_flag", "/api/extra/version"),
    ],
)
def test_each_probe_asks_its_own_endpoint(probe: str, path: str) -> None:
    assert probe_path(probe) == path  # type: ignore[arg-type]


# -- text: GET /v1/models ---------------------------------------------------------------


def test_a_models_list_with_an_active_id_is_ready() -> None:
    assert models_ready(200, LLAMA_MODELS)


def test_a_kobold_style_models_list_naming_the_model_is_ready() -> None:
    assert models_ready(200, _json({"models": [{"name": "koboldcpp/chat"}]}))


def test_a_bare_json_list_of_models_with_an_active_id_is_ready() -> None:
    assert models_ready(200, _json([{"id": "chat-small"}]))


def test_a_non_json_models_body_is_ready() -> None:
    assert models_ready(200, b"chat-small loaded")


@pytest.mark.parametrize("status", [199, 300, 404, 500, 503])
def test_a_models_answer_that_is_not_2xx_is_never_ready(status: int) -> None:
    assert not models_ready(status, LLAMA_MODELS)


@pytest.mark.parametrize("body", [b"", b"   ", b"\n\t"])
def test_an_empty_models_body_is_not_ready(body: bytes) -> None:
    assert not models_ready(200, body)


def test_a_models_list_whose_only_id_is_inactive_is_not_ready() -> None:
    assert not models_ready(200, _json({"data": [{"id": "inactive"}]}))


def test_a_models_list_with_one_inactive_and_one_active_id_is_ready() -> None:
    assert models_ready(200, _json({"data": [{"id": "inactive"}, {"id": "chat-small"}]}))


@pytest.mark.parametrize("entry", [{"id": ""}, {"id": "   "}, {"id": None}, {"id": 7}, {}])
def test_a_models_list_without_a_usable_id_is_not_ready(entry: dict[str, object]) -> None:
    assert not models_ready(200, _json({"data": [entry]}))


def test_an_empty_models_list_is_not_ready() -> None:
    assert not models_ready(200, _json({"object": "list", "data": []}))
    assert not models_ready(200, _json([]))


@pytest.mark.parametrize("key", ["model", "id"])
def test_a_top_level_inactive_model_is_not_ready_even_with_a_listed_id(key: str) -> None:
    body = _json({key: "inactive", "data": [{"id": "chat-small"}]})
    assert not models_ready(200, body)


# -- image: GET /sdapi/v1/sd-models -----------------------------------------------------


def test_an_sd_models_list_with_an_active_entry_is_ready() -> None:
    assert sd_models_ready(200, SD_MODELS)


@pytest.mark.parametrize("key", ["model_name", "title", "model", "id"])
def test_any_naming_field_of_an_sd_model_entry_counts(key: str) -> None:
    assert sd_models_ready(200, _json([{key: "image-sd"}]))


def test_an_sd_models_object_with_a_data_list_is_read_like_a_list() -> None:
    assert sd_models_ready(200, _json({"data": [{"model_name": "image-sd"}]}))


def test_an_sd_models_entry_named_inactive_is_not_ready() -> None:
    assert not sd_models_ready(200, _json([{"model_name": "inactive", "title": "inactive"}]))


def test_an_sd_models_entry_with_only_blank_names_is_not_ready() -> None:
    assert not sd_models_ready(200, _json([{"model_name": "", "title": "  "}]))


@pytest.mark.parametrize(
    "body", [b"", b"not json", _json([]), _json({"data": []}), _json({"title": "x"}), _json(3)]
)
def test_an_sd_models_answer_without_an_entry_list_is_not_ready(body: bytes) -> None:
    assert not sd_models_ready(200, body)


@pytest.mark.parametrize("status", [302, 404, 503])
def test_an_sd_models_answer_that_is_not_2xx_is_never_ready(status: int) -> None:
    assert not sd_models_ready(status, SD_MODELS)


# -- whisper (split) and vllm: GET /health ----------------------------------------------


@pytest.mark.parametrize("status", [200, 204, 299])
def test_any_2xx_health_answer_is_ready_whatever_the_body(status: int) -> None:
    assert health_ready(status, b"")
    assert health_ready(status, b'{"status": "loading"}')


@pytest.mark.parametrize("status", [199, 300, 500, 503])
def test_a_health_answer_that_is_not_2xx_is_not_ready(status: int) -> None:
    assert not health_ready(status, b'{"status": "ok"}')


# -- kobold capability flags: GET /api/extra/version -------------------------------------


@pytest.mark.parametrize("flag", ["transcribe", "embeddings", "tts", "music"])
def test_a_kobold_flag_that_is_json_true_is_ready(flag: str) -> None:
    assert kobold_flag_ready(200, _json({"result": "KoboldCpp", flag: True}), flag)


@pytest.mark.parametrize(
    "body",
    [
        _json({"result": "KoboldCpp"}),
        _json({"transcribe": False}),
        _json({"transcribe": "true"}),
        _json({"transcribe": 1}),
        _json({"transcribe": None}),
        _json([{"transcribe": True}]),
        b"{transcribe: true",
        b"",
    ],
    ids=["missing", "false", "string-true", "one", "null", "list", "invalid-json", "empty"],
)
def test_a_kobold_flag_that_is_not_a_real_true_is_not_ready(body: bytes) -> None:
    assert not kobold_flag_ready(200, body, "transcribe")


def test_a_kobold_flag_for_another_capability_does_not_count() -> None:
    assert not kobold_flag_ready(200, _json({"tts": True}), "transcribe")


@pytest.mark.parametrize("status", [404, 500, 503])
def test_a_kobold_flag_answer_that_is_not_2xx_is_never_ready(status: int) -> None:
    assert not kobold_flag_ready(status, _json({"transcribe": True}), "transcribe")


# -- dispatch ---------------------------------------------------------------------------


def test_is_ready_applies_the_rule_of_the_named_probe() -> None:
    inactive = _json({"data": [{"id": "inactive"}]})
    assert is_ready("models", 200, LLAMA_MODELS)
    assert not is_ready("models", 200, inactive)
    assert is_ready("sd_models", 200, SD_MODELS)
    assert not is_ready("sd_models", 200, b"chat-small loaded")
    assert is_ready("health", 200, b"")
    assert not is_ready("health", 503, b"")


def test_is_ready_checks_the_kobold_flag_it_is_given() -> None:
    body = _json({"transcribe": True, "embeddings": False})
    assert is_ready("kobold_flag", 200, body, flag="transcribe")
    assert not is_ready("kobold_flag", 200, body, flag="embeddings")


# -- what a server says its model reads ---------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "vision"),
    [
        ({"id": "m", "input_modalities": ["text", "image"]}, True),
        ({"id": "m", "input_modalities": ["text"]}, False),
        ({"id": "m", "architecture": {"input_modalities": ["image", "text"]}}, True),
        ({"id": "m", "modalities": {"vision": True, "audio": False}}, True),
        ({"id": "m", "modalities": {"vision": False}}, False),
        ({"id": "m", "capabilities": ["completion", "vision"]}, True),
        ({"id": "m", "capabilities": ["completion"]}, False),
        ({"id": "m"}, None),
    ],
)
def test_a_models_entry_says_whether_its_model_reads_images(
    entry: dict[str, object], vision: bool | None
) -> None:
    assert reported_vision(_json({"data": [entry]}), "m") is vision


def test_the_entry_of_the_served_model_is_read_and_else_the_only_one() -> None:
    doc = {
        "data": [
            {"id": "a", "input_modalities": ["text"]},
            {"id": "b", "input_modalities": ["text", "image"]},
        ]
    }
    assert reported_vision(_json(doc), "b") is True
    assert reported_vision(_json(doc), "a") is False
    # Two entries and neither is the one: nothing is known.
    assert reported_vision(_json(doc), "c") is None
    only = {"data": [{"id": "other", "input_modalities": ["image"]}]}
    assert reported_vision(_json(only), "c") is True
    assert reported_vision(b"not json", "c") is None
