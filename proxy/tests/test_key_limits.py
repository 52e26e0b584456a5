# ruff: noqa: F811
"""Per-key limits at the node's edge (in process, a sim backend): the 429 of every path family
with Retry-After and the `x-ratelimit-*` headers, the headers on answers that pass (a stream's
head too), tokens charged from the backend's usage, a hang-up freeing its slot, the metric."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from prometheus_client import generate_latest

from access import limits
from access.keys import KeyRecord, KeyTable, install_table, reset_for_tests, secret_hash
from proxy.edge.app import ProxyApp
from proxy.edge.limits import estimated_tokens
from proxy.observe.metrics import REGISTRY
from proxy.tests.test_app import (  # noqa: F401
    MESSAGE_TIMEOUT_SECS,
    Fallback,
    NodeFactory,
    _chat,
    _communicator,
    _wait_for,
    fallback,
    make_node,
    request,
)

RPM = "rk-" + "R" * 43  # rpm 2
TPM = "rk-" + "T" * 43  # tpm 100
PAR = "rk-" + "P" * 43  # max_concurrent 1
FREE = "rk-" + "F" * 43  # no limit


class FakeClock:
    now = 1000.25

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _keys() -> Iterator[FakeClock]:
    install_table(
        KeyTable(
            [
                KeyRecord(name="rpm-key", key_hash=secret_hash(RPM), rpm=2),
                KeyRecord(name="tpm-key", key_hash=secret_hash(TPM), tpm=100),
                KeyRecord(name="par-key", key_hash=secret_hash(PAR), max_concurrent=1),
                KeyRecord(name="free-key", key_hash=secret_hash(FREE)),
            ]
        )
    )
    clock = FakeClock()
    limits.reset_for_tests(clock)
    yield clock
    reset_for_tests()
    limits.reset_for_tests()


def bearer(secret: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", b"Bearer " + secret.encode())]


def refused_count() -> float:
    # The registry is the process's: another test may have counted before this one.
    value = REGISTRY.get_sample_value(
        "router_key_rate_limited_total", {"key": "rpm-key", "limit": "requests"}
    )
    return value or 0.0


def rate_headers(answer: Any) -> dict[bytes, bytes]:
    return {k: v for k, v in answer.headers.items() if k.startswith(b"x-ratelimit-")}


async def test_rpm_answers_429_rate_limited_in_each_familys_envelope(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    key = bearer(RPM)
    refused_before = refused_count()
    first = await request(
        app, "POST", "/v1/chat/completions", _chat("chat", max_tokens=2), headers=key
    )
    assert first.status == 200
    assert rate_headers(first) == {
        b"x-ratelimit-limit-requests": b"2",
        b"x-ratelimit-remaining-requests": b"1",
    }
    ollama = await request(
        app, "POST", "/api/chat", {**_chat("chat", max_tokens=2), "stream": False}, headers=key
    )
    assert ollama.status == 200
    assert ollama.headers[b"x-ratelimit-remaining-requests"] == b"0"
    # Past the limit, on every family: the status, the code, Retry-After, the headers.
    refused = {
        "/v1/chat/completions": _chat("chat", max_tokens=2),
        "/v1/messages": {**_chat("chat", max_tokens=2), "stream": False},
        "/api/generate": {"model": "chat", "prompt": "hi", "stream": False},
        "/api/v1/generate": {"model": "chat", "prompt": "hi"},
    }
    for path, body in refused.items():
        answer = await request(app, "POST", path, body, headers=key)
        assert answer.status == 429, path
        # The minute started at second 1000: it ends at 1061, 60.75 s from 1000.25.
        assert answer.headers[b"retry-after"] == b"61", path
        assert rate_headers(answer) == {
            b"x-ratelimit-limit-requests": b"2",
            b"x-ratelimit-remaining-requests": b"0",
        }, path
        if path.startswith("/api/") and not path.startswith("/api/v1/"):
            assert answer.json() == {
                "error": "key 'rpm-key' is over its limit of 2 requests per minute (rate_limited)"
            }
        elif path == "/v1/messages":
            assert answer.json() == {
                "type": "error",
                "error": {
                    "type": "rate_limit_error",
                    "message": "key 'rpm-key' is over its limit of 2 requests per minute "
                    "(rate_limited)",
                    "details": {"error_code": "rate_limited"},
                },
            }
        else:
            assert answer.json()["error"] == {
                "message": "key 'rpm-key' is over its limit of 2 requests per minute "
                "(rate_limited)",
                "type": "rate_limit_error",
                "code": "rate_limited",
            }, path
    assert refused_count() == refused_before + 4
    assert 'router_key_rate_limited_total{key="rpm-key",limit="requests"}' in (
        generate_latest(REGISTRY).decode()
    )


async def test_requests_that_ask_a_model_for_nothing_are_not_counted(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    key = bearer(RPM)
    for _ in range(3):
        listing = await request(app, "GET", "/v1/models", headers=key)
        assert listing.status == 200
        assert rate_headers(listing) == {}
        assert (
            await request(app, "POST", "/api/show", {"model": "chat"}, headers=key)
        ).status == 200
        # A Kobold client polls its generation and stops it: neither asks the model anything.
        for path in ("/api/extra/generate/check", "/api/extra/abort"):
            follow_up = await request(app, "POST", path, {"genkey": "KCPP1"}, headers=key)
            assert follow_up.status == 200 and rate_headers(follow_up) == {}
    assert limits.current_limiter().report() == {}
    # A key without limits gets no headers and no counters.
    free = await request(
        app, "POST", "/v1/chat/completions", _chat("chat", max_tokens=2), headers=bearer(FREE)
    )
    assert free.status == 200
    assert rate_headers(free) == {}
    assert limits.current_limiter().report() == {}


async def test_tpm_charges_what_the_backend_reported_and_refuses_past_it(
    make_node: NodeFactory, fallback: Fallback, _keys: FakeClock
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    key = bearer(TPM)
    body = _chat("chat", max_tokens=30)
    estimate = estimated_tokens(orjson.dumps(body))
    assert estimate == -(-len(orjson.dumps(body)) // 4) + 30
    answer = await request(app, "POST", "/v1/chat/completions", body, headers=key)
    assert answer.status == 200
    assert answer.headers[b"x-ratelimit-limit-tokens"] == b"100"
    assert answer.headers[b"x-ratelimit-remaining-tokens"] == str(100 - estimate).encode()
    usage = answer.json()["usage"]
    used = usage["prompt_tokens"] + usage["completion_tokens"]
    # The reservation is gone with the request; what the backend reported stays a minute.
    assert limits.current_limiter().report() == {"tpm-key": (1, used, 0)}
    while limits.current_limiter().report()["tpm-key"][1] + estimate <= 100:
        assert (await request(app, "POST", "/v1/chat/completions", body, headers=key)).status == 200
    refused = await request(app, "POST", "/v1/chat/completions", body, headers=key)
    assert refused.status == 429
    assert refused.json()["error"]["message"] == (
        "key 'tpm-key' is over its limit of 100 tokens per minute (rate_limited)"
    )
    _keys.now += 61
    assert (await request(app, "POST", "/v1/chat/completions", body, headers=key)).status == 200


async def test_max_concurrent_refuses_a_second_request_and_a_hang_up_frees_the_slot_at_once(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    key = bearer(PAR)
    comm = _communicator(
        app, "POST", "/v1/chat/completions", headers=[(b"content-type", b"application/json"), *key]
    )
    body = orjson.dumps(_chat("slow", max_tokens=400, stream=True))
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
    assert start["status"] == 200
    # A stream's head carries the headers too (this key has no rpm or tpm: none to show).
    assert limits.current_limiter().in_flight("par-key") == 1
    second = await request(
        app, "POST", "/v1/chat/completions", _chat("chat", max_tokens=2), headers=key
    )
    assert second.status == 429
    assert second.headers[b"retry-after"] == b"1"
    assert second.json()["error"]["code"] == "too_many_concurrent"
    await comm.send_input({"type": "http.disconnect"})
    await comm.wait(MESSAGE_TIMEOUT_SECS)
    assert limits.current_limiter().in_flight("par-key") == 0
    again = await request(
        app, "POST", "/v1/chat/completions", _chat("chat", max_tokens=2), headers=key
    )
    assert again.status == 200


async def test_a_streams_head_carries_the_headers(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    answer = await request(
        app,
        "POST",
        "/v1/chat/completions",
        _chat("chat", max_tokens=3, stream=True),
        headers=bearer(RPM),
    )
    assert answer.status == 200
    assert answer.headers[b"content-type"].startswith(b"text/event-stream")
    assert rate_headers(answer) == {
        b"x-ratelimit-limit-requests": b"2",
        b"x-ratelimit-remaining-requests": b"1",
    }


async def test_a_body_that_is_no_json_is_estimated_and_never_crashes_admission(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    assert estimated_tokens(b"{not json") == 3 + 16
    assert estimated_tokens(b"") == 16
    assert estimated_tokens(b"--boundary\r\n" + b"\x00" * 4000) == 16  # an upload: no prompt
    assert estimated_tokens(b'{"max_tokens": true}') == 5 + 16
    answer = await request(app, "POST", "/v1/chat/completions", b"{not json", headers=bearer(TPM))
    assert answer.status == 400
    assert answer.headers[b"x-ratelimit-remaining-tokens"] == b"81"
    assert limits.current_limiter().report() == {"tpm-key": (1, 0, 0)}


def test_what_a_request_is_charged_when_it_ends() -> None:
    from dataclasses import replace
    from typing import cast

    from proxy.forwarding.local import Job, _charged_tokens

    job = Job(
        cfg=cast(Any, None),
        lane="text",
        model_id="chat",
        public_id="chat",
        backend_path="/v1/chat/completions",
        body=b"{" + b" " * 39,
        prompt_bytes=40,
        max_tokens=5,
    )
    # What the backend reported, when it reported anything.
    assert _charged_tokens(job, 3, 4) == 7
    assert _charged_tokens(job, 0, 4) == 4
    # Else the estimate: 40 bytes are 10 tokens, and the completion it asked for.
    assert _charged_tokens(job, 0, 0) == 10 + 5
    assert _charged_tokens(replace(job, max_tokens=None), 0, 0) == 10 + 16
    # An upload's bytes are no prompt.
    assert _charged_tokens(replace(job, content_type=b"multipart/form-data; boundary=b"), 0, 0) == 0


async def test_the_node_route_takes_a_report_on_the_master_and_refuses_a_malformed_one(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    token = "cluster-token-limits"
    node = make_node(cluster={"node_id": "boss", "role": "master", "token": token})
    app = ProxyApp(fallback, node_getter=lambda: node)
    auth = bearer(token)
    path = "/router/v1/node/limits"
    taken = await request(
        app, "POST", path, {"node_id": "s1", "keys": {"rpm-key": [1, 0, 0]}}, headers=auth
    )
    assert (taken.status, taken.json()) == (200, {"keys": {}})
    seen = await request(app, "GET", path, headers=auth)
    assert seen.json() == {
        "node_id": "boss",
        "keys": {"rpm-key": {"here": [0, 0, 0], "cluster": [1, 0, 0]}},
    }
    no_id = await request(app, "POST", path, {"keys": {}}, headers=auth)
    assert (no_id.status, no_id.json()["error"]["param"]) == (400, "node_id")
    bad = await request(app, "POST", path, {"node_id": "s1", "keys": {"x": [1]}}, headers=auth)
    assert (bad.status, bad.json()["error"]["param"]) == (400, "keys")
    assert (await request(app, "GET", path)).status == 401


async def test_a_client_that_hangs_up_while_waiting_for_the_backend_frees_its_slot(
    make_node: NodeFactory, fallback: Fallback
) -> None:
    install_table(KeyTable([KeyRecord(name="pair", key_hash=secret_hash(PAR), max_concurrent=2)]))
    node = make_node()
    app = ProxyApp(fallback, node_getter=lambda: node)
    headers = [(b"content-type", b"application/json"), *bearer(PAR)]
    limiter = limits.current_limiter()
    # The first holds the model's only slot (parallel 1) with a long stream.
    running = _communicator(app, "POST", "/v1/chat/completions", headers=headers)
    body = orjson.dumps(_chat("slow", max_tokens=400, stream=True))
    await running.send_input({"type": "http.request", "body": body, "more_body": False})
    assert (await running.receive_output(MESSAGE_TIMEOUT_SECS))["status"] == 200
    # The second waits for it, counted in flight, and its client gives up.
    waiting = _communicator(app, "POST", "/v1/chat/completions", headers=headers)
    await waiting.send_input({"type": "http.request", "body": body, "more_body": False})
    await _wait_for(lambda: _true(limiter.in_flight("pair") == 2), "the second is in flight")
    await waiting.send_input({"type": "http.disconnect"})
    await waiting.wait(MESSAGE_TIMEOUT_SECS)
    assert limiter.in_flight("pair") == 1
    await running.send_input({"type": "http.disconnect"})
    await running.wait(MESSAGE_TIMEOUT_SECS)
    assert limiter.in_flight("pair") == 0


async def _true(value: bool) -> bool:
    return value
