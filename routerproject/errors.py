"""One shape for every error the router answers: the OpenAI envelope, or Ollama's and
Anthropic's on their paths."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

# A name echoed in an error is there to be recognised: two hundred characters do that, and a
# client that sent a megabyte of name does not get it back (nor does the log).
ECHO_MAX_CHARS = 200
# An unknown model's answer lists the models that exist, as Ollama's does; past this many the
# rest are counted, so a large cluster's answer stays readable.
LISTED_MODELS_MAX = 50


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
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after = retry_after
        """Seconds for a `Retry-After` header: the condition is expected to clear by then."""
        self.models: tuple[str, ...] = ()
        """For an unknown model: the models that exist, which the answer lists (those the
        request's key may use; see `with_models`)."""

    def with_models(self, models: Iterable[str]) -> RouterError:
        """This error with `models` named in its message (the first `LISTED_MODELS_MAX`)."""
        shown = list(models)
        if not shown:
            return self
        names = ", ".join(echo(m) for m in shown[:LISTED_MODELS_MAX])
        if len(shown) > LISTED_MODELS_MAX:
            names += f" and {len(shown) - LISTED_MODELS_MAX} more"
        return RouterError(
            self.status,
            f"{self.message}; the models here are: {names}",
            type=self.type,
            code=self.code,
            param=self.param,
            retry_after=self.retry_after,
        )

    def envelope(self) -> dict[str, Any]:
        return error_envelope(self.message, type=self.type, code=self.code, param=self.param)


class BackendError(Exception):
    """The backend could not serve: it failed to load, died, or is not reachable.

    Raised by the proxy's runtimes; the management API below them turns it into a 502.
    """


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
    # Every `/api/` path is Ollama's but Kobold's own (`/api/v1/…`, `/api/extra/…`): an
    # unknown Ollama path must answer in Ollama's error shape too.
    return path.startswith("/api/") and not path.startswith(("/api/v1/", "/api/extra/"))


ANTHROPIC_PATH = "/v1/messages"

# Anthropic's error types by status (its SDKs read `error.type` and `error.message`); a status
# missing here is a client error when below 500 and an API error from 500 on.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    # Messages and its token count: what the Anthropic SDKs call.
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def anthropic_envelope(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """Anthropic's error shape; the router's stable code and the field go in `details`, where
    the Anthropic SDK reads `error_code`."""
    fallback = "invalid_request_error" if status < 500 else "api_error"
    err: dict[str, Any] = {"type": _ANTHROPIC_TYPES.get(status, fallback), "message": message}
    details = {key: value for key, value in (("error_code", code), ("param", param)) if value}
    if details:
        err["details"] = details
    return {"type": "error", "error": err}


def error_body(path: str, err: RouterError) -> bytes:
    if is_ollama_path(path):
        return orjson.dumps({"error": err.message})
    if is_anthropic_path(path):
        return orjson.dumps(
            anthropic_envelope(err.status, err.message, code=err.code, param=err.param)
        )
    return orjson.dumps(err.envelope())


def echo(text: str, limit: int = ECHO_MAX_CHARS) -> str:
    """`text` as an error message may repeat it: cut past `limit` characters, saying so."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"
