"""The access line's record, without a server: what `logging` would have made of the call,
less the stack walk for the caller's file and line."""

from __future__ import annotations

import gc
import logging
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

from proxy.observe import health
from proxy.request import Ctx


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _ctx() -> Ctx:
    async def nothing(*_: Any) -> Any:
        return None

    ctx = Ctx({"headers": []}, nothing, nothing, "/v1/chat/completions", "POST", request_id="r-1")
    ctx.model, ctx.served_node, ctx.backend = "chat", "node-b", "text/sim"
    ctx.status, ctx.sent_bytes = 200, 321
    return ctx


def test_the_access_record_is_the_one_logging_would_make(monkeypatch: pytest.MonkeyPatch) -> None:
    keep = Keep()
    monkeypatch.setattr(health.access, "handlers", [keep])
    monkeypatch.setattr(health.access, "propagate", False)
    monkeypatch.setattr(health.access, "level", logging.INFO)
    # Never asked for: no format shows the caller's file or line.
    monkeypatch.setattr(health.access, "findCaller", None)
    ctx = _ctx()
    node: Any = SimpleNamespace(node_id="node-a")
    health._line(ctx, node, logging.INFO, 200, ctx.t0 + 0.0125)

    (record,) = keep.records
    assert record.name == "router.access" and record.levelno == logging.INFO
    assert record.getMessage() == (
        "POST /v1/chat/completions model=chat node=node-b backend=text/sim lent_to=- key=- "
        "status=200 bytes=321 ms=12.5"
    )
    fields = {name: getattr(record, name) for name in ("event", "request_id", "node", "ms")}
    assert fields == {"event": "access", "request_id": "r-1", "node": "node-b", "ms": 12.5}
    assert (record.filename, record.funcName) == ("health.py", "_line")


def test_writing_the_access_line_leaves_no_reference_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every request writes one: a cycle through it (a frame held in its own locals) kept the
    # request's context, its record and its callers' frames for the collector, and its
    # collections paused the node for tens of milliseconds under load.
    keep = Keep()
    monkeypatch.setattr(health.access, "handlers", [keep])
    monkeypatch.setattr(health.access, "propagate", False)
    monkeypatch.setattr(health.access, "level", logging.INFO)
    ctx = _ctx()
    gone = weakref.ref(ctx)
    node: Any = SimpleNamespace(node_id="node-a")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        health._line(ctx, node, logging.INFO, 200, ctx.t0 + 0.0125)
        del ctx
        assert gone() is None, "the request's context outlived its access line"
    finally:
        if was_enabled:
            gc.enable()
    assert len(keep.records) == 1
