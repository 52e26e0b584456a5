"""Where a request meets its key's limits (access/limits.py): at the edge, once the key is
known and the body read, before any family queues or forwards it.

`admit` counts a metered request (or raises the 429), and puts the `x-ratelimit-*` headers on
whatever answer the request gets, a stream's head included; the edge gives the ticket back
in its `finally`, so a client that goes away (the edge cancels its task) frees its slot at once.
The tokens a request really used are charged where its backend's usage is recorded
(proxy/forwarding/local.py), on the node that ran it.
"""

from __future__ import annotations

from typing import Any

import orjson

from access.identity import STORED, Caller
from access.keys import current_table
from access.limits import CONCURRENT, TOKENS, Decision, Limits, Ticket, current_limiter
from proxy import work
from proxy.observe import metrics
from proxy.request import Ctx, Send
from routerproject.errors import RouterError, echo

METERED_METHOD = "POST"
# POSTs that ask a model for nothing: Ollama clients call /api/show before every chat, and
# Kobold clients poll a generation's text while it runs and stop it with an abort.
UNMETERED_PATHS = frozenset(
    {
        "/api/show",
        "/v1/messages/count_tokens",
        "/api/extra/generate/check",
        "/api/extra/abort",
    }
)


def estimated_tokens(body: bytes) -> int:
    """Prompt and completion tokens a request will use, before it runs: the prompt by the
    contract's four bytes a token (what the sim and the work profile use without a fit), the
    completion by the body's `max_tokens` (or its family's name for it), else the default.
    A body that is no JSON object (an audio or image upload) has no prompt to count."""
    if body[:1] != b"{":
        return work.DEFAULT_MAX_TOKENS
    prompt = work.prompt_tokens_for_bytes(len(body))
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    completion = work.output_tokens(doc) if isinstance(doc, dict) else work.DEFAULT_MAX_TOKENS
    return prompt + completion


def _with_headers(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return sending


def _refusal(name: str, decision: Decision) -> RouterError:
    limits = decision.limits
    if decision.refused_by == CONCURRENT:
        return RouterError(
            429,
            f"key {echo(name)!r} has {limits.max_concurrent} requests in flight, its "
            "max_concurrent (too_many_concurrent)",
            type="rate_limit_error",
            code="too_many_concurrent",
        )
    what = (
        f"{limits.tpm} tokens per minute"
        if decision.refused_by == TOKENS
        else f"{limits.rpm} requests per minute"
    )
    return RouterError(
        429,
        f"key {echo(name)!r} is over its limit of {what} (rate_limited)",
        type="rate_limit_error",
        code="rate_limited",
    )


def admit(ctx: Ctx, caller: Caller) -> Ticket | None:
    """Count the request against its key's limits; RouterError 429 when one is reached.

    Only stored keys with a limit, and only POSTs that ask a model for work, are metered:
    every other request costs one attribute check here."""
    if caller.kind != STORED or not caller.name:
        return None
    limits = Limits(caller.rpm, caller.tpm, caller.max_concurrent)
    if not limits.any or ctx.method != METERED_METHOD or ctx.path in UNMETERED_PATHS:
        return None
    limiter = current_limiter()
    limiter.follow(current_table())
    decision = limiter.admit(caller.name, limits, estimated_tokens(ctx.body))
    ctx.send = _with_headers(ctx.send, decision.headers())
    if not decision.admitted:
        metrics.key_rate_limited(caller.name, str(decision.refused_by))
        # Retry-After comes with the error (Ctx.error adds it).
        err = _refusal(caller.name, decision)
        err.retry_after = decision.retry_after_secs
        raise err
    return decision.ticket


def release(ticket: Ticket | None) -> None:
    current_limiter().release(ticket)
