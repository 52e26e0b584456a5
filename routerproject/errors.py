"""One shape for every error the router answers: the OpenAI envelope, or Ollama's on its paths."""

from __future__ import annotations

from typing import Any

import orjson

# A name echoed in an error is there to be recognised: two hundred characters do that, and a
# client that sent a megabyte of name does not get it back (nor does the log).
ECHO_MAX_CHARS = 200


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


def error_body(path: str, err: RouterError) -> bytes:
    if is_ollama_path(path):
        return orjson.dumps({"error": err.message})
    return orjson.dumps(err.envelope())


def echo(text: str, limit: int = ECHO_MAX_CHARS) -> str:
    """`text` as an error message may repeat it: cut past `limit` characters, saying so."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"
