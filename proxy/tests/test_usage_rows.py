"""Which attempt of a lent request writes its usage row: exactly one per request.

A helper that hands a borrowed request back (409, a 5xx head, or cut off before answering)
writes nothing; its owner runs the request and writes the row. A helper that answered writes
it, and its owner (whose job is then `lent`) does not.
"""

from __future__ import annotations

from typing import Any

import pytest

from proxy.forwarding.local import handed_back
from proxy.request import Ctx
from routerproject.errors import RouterError


def ctx(*, borrowed: bool = True, started: int = 0, disconnected: bool = False) -> Ctx:
    async def receive() -> dict[str, Any]:
        return {}

    async def send(message: dict[str, Any]) -> None:
        return None

    request = Ctx({"headers": []}, receive, send, "/v1/chat/completions", "POST")
    request.borrowed = borrowed
    request.started, request.status = bool(started), started
    request.disconnected = disconnected
    return request


RETURNED = RouterError(409, "the helper's own work arrived", code="offload_returned")


@pytest.mark.parametrize(
    ("request_ctx", "failure"),
    [
        (ctx(), RETURNED),
        (ctx(), RouterError(502, "backend failed")),
        (ctx(started=409), None),
        (ctx(started=500), None),
        (ctx(disconnected=True), None),
    ],
    ids=["returned", "error-before-answer", "409-head", "5xx-head", "owner-cut-it-off"],
)
def test_a_borrowed_attempt_the_owner_runs_again_writes_no_row(
    request_ctx: Ctx, failure: RouterError | None
) -> None:
    assert handed_back(request_ctx, failure)


@pytest.mark.parametrize(
    ("request_ctx", "failure"),
    [
        (ctx(started=200), None),
        # Cut after the answer began: the owner passed it on and cannot run it again.
        (ctx(started=200), RouterError(502, "backend failed")),
        (ctx(started=200, disconnected=True), None),
        (ctx(), RouterError(400, "bad body")),
        (ctx(started=400), None),
        (ctx(borrowed=False), RETURNED),
        (ctx(borrowed=False, started=503), None),
    ],
    ids=["ok", "cut-mid-stream", "gone-mid-stream", "4xx-error", "4xx-head", "own", "own-5xx"],
)
def test_an_answer_that_reached_the_owner_and_every_own_request_write_their_row(
    request_ctx: Ctx, failure: RouterError | None
) -> None:
    assert not handed_back(request_ctx, failure)
