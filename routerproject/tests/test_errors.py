"""The error envelopes by path family, and the list an unknown model's answer carries."""

from __future__ import annotations

import orjson
import pytest

from routerproject.errors import LISTED_MODELS_MAX, RouterError, error_body


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (415, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
    ],
)
def test_anthropic_paths_get_anthropics_envelope_with_its_type_for_the_status(
    status: int, kind: str
) -> None:
    err = RouterError(status, "no", code="some_code", param="model")
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        assert orjson.loads(error_body(path, err)) == {
            "type": "error",
            "error": {
                "type": kind,
                "message": "no",
                "details": {"error_code": "some_code", "param": "model"},
            },
        }


def test_other_paths_keep_their_families_envelope() -> None:
    err = RouterError(404, "gone", code="model_not_found")
    assert orjson.loads(error_body("/api/chat", err)) == {"error": "gone"}
    for path in ("/v1/chat/completions", "/v1/messagesx", "/api/v1/generate"):
        assert orjson.loads(error_body(path, err))["error"]["code"] == "model_not_found"


def test_an_error_without_code_or_param_has_no_details() -> None:
    body = orjson.loads(error_body("/v1/messages", RouterError(400, "bad")))
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}


def test_the_models_listed_are_counted_past_the_limit() -> None:
    err = RouterError(404, 'model "x" was not found', code="model_not_found", param="model")
    names = [f"m{i:03d}" for i in range(LISTED_MODELS_MAX + 3)]
    listed = err.with_models(names)
    shown = ", ".join(names[:LISTED_MODELS_MAX])
    assert listed.message == f'model "x" was not found; the models here are: {shown} and 3 more'
    assert (listed.status, listed.code, listed.param) == (404, "model_not_found", "model")
    # Nothing to list leaves the answer as it was.
    assert err.with_models([]) is err
