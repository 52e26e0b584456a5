"""One shape for every error the router answers: the OpenAI envelope, or Ollama's on its paths."""

from __future__ import annotations

from typing import Any

import orjson
from rest_framework.response import Response
from rest_framework.views import exception_handler

OLLAMA_PREFIXES = ("/api/chat", "/api/generate", "/api/tags", "/api/ps", "/api/embed", "/api/show")


class RouterError(Exception):
    """An error with the status and envelope fields a client should see."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def envelope(self) -> dict[str, Any]:
        return error_envelope(self.message, type=self.type, code=self.code, param=self.param)


def error_envelope(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    err: dict[str, Any] = {"message": message, "type": type}
    if code is not None:
        err["code"] = code
    if param is not None:
        err["param"] = param
    return {"error": err}


def is_ollama_path(path: str) -> bool:
    return path.startswith(OLLAMA_PREFIXES)


def error_body(path: str, err: RouterError) -> bytes:
    if is_ollama_path(path):
        return orjson.dumps({"error": err.message})
    return orjson.dumps(err.envelope())


def drf_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RouterError):
        return Response(exc.envelope(), status=exc.status)
    response = exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, dict) and "detail" in data:
        message = str(data["detail"])
        param = None
    else:
        # A serializer error: name the first field at fault, as clients expect from OpenAI.
        param, message = _first_field_error(data)
    kind = "invalid_request_error" if response.status_code < 500 else "server_error"
    response.data = error_envelope(message, type=kind, param=param)
    return response


def _first_field_error(data: Any, prefix: str = "") -> tuple[str | None, str]:
    if isinstance(data, dict):
        for key, value in data.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                name = prefix or ""
            param, message = _first_field_error(value, name)
            return (param or None), message
    if isinstance(data, list) and data:
        return _first_field_error(data[0], prefix)
    return (prefix or None), f"{prefix}: {data}" if prefix else str(data)
