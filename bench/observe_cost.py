"""What observability costs one request, measured in process: counting it (`/metrics`), its
tokens, and writing its access line (text and JSON), plus what one scrape costs.

`bench/overhead.py` measures the whole added latency through a real router; on a busy
machine its run-to-run spread (tenths of a millisecond) hides a few microseconds, so this
times the very functions the request path calls, best of several rounds (the least disturbed).

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/observe_cost.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/observe_cost.py`, this file's folder comes first on sys.path, where the
# sibling `queue.py` would shadow the standard library's `queue`.
sys.path[0] = str(Path(__file__).resolve().parent.parent)
# ruff: noqa: E402  (the path fix above must run before these imports)

import io
import json
import logging
import os
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerproject.settings")
REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("ROUTER_CONFIG", str(REPO / "tests" / "config.test.yaml"))

import django

django.setup()

from pythonjsonlogger.json import JsonFormatter

from proxy.observe import health, metrics
from proxy.request import Ctx

N = 20_000
ROUNDS = 5
TARGET_US = 50.0  # the counting budget: 0.05 ms per request


async def _receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


async def _send(_: dict[str, Any]) -> None:
    return None


def _ctx() -> Ctx:
    ctx = Ctx({"headers": []}, _receive, _send, "/v1/chat/completions", "POST", request_id="r")
    ctx.model, ctx.served_node, ctx.backend = "bench", "node-a", "text/sim"
    ctx.status, ctx.finished, ctx.first_byte, ctx.sent_bytes = 200, True, ctx.t0 + 0.001, 300
    return ctx


def best_us(run: Callable[[list[Ctx]], None]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        ctxs = [_ctx() for _ in range(N)]
        start = time.perf_counter()
        run(ctxs)
        best = min(best, (time.perf_counter() - start) / N * 1e6)
    return best


def main() -> None:
    node: Any = SimpleNamespace(node_id="node-a")
    access = logging.getLogger("router.access")
    access.propagate = False
    access.setLevel(logging.INFO)
    handler = logging.StreamHandler(io.StringIO())
    access.handlers = [handler]

    def count(ctxs: list[Ctx]) -> None:
        for c in ctxs:
            metrics.request_finished(c, node, 200, c.t0 + 0.002)
            metrics.tokens_counted("bench", 12, 16)

    def line(ctxs: list[Ctx]) -> None:
        for c in ctxs:
            health._line(c, node, logging.INFO, 200, c.t0 + 0.002)

    counting = best_us(count)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    text = best_us(line)
    handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    as_json = best_us(line)
    start = time.perf_counter()
    size = len(metrics.generate_latest(metrics.REGISTRY))
    scrape_ms = (time.perf_counter() - start) * 1000.0
    rows = [
        ("count request + tokens", counting, "us/request"),
        ("access line, text", text, "us/request"),
        ("access line, json", as_json, "us/request"),
        ("scrape of the counters", scrape_ms, f"ms ({size} bytes)"),
    ]
    for name, value, unit in rows:
        print(f"{name:<26} {value:>9.2f} {unit}")
    print(
        json.dumps(
            {
                "bench": "observe_cost",
                "count_us": round(counting, 2),
                "access_text_us": round(text, 2),
                "access_json_us": round(as_json, 2),
                "scrape_counters_ms": round(scrape_ms, 3),
                "targets": {"count_us": TARGET_US},
                "pass": counting <= TARGET_US,
            }
        )
    )


if __name__ == "__main__":
    main()
