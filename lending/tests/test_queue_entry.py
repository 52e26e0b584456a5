"""What a request enters the router queue as: its size estimate, and whether it may be lent."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from access.identity import CALLER_SCOPE_KEY, MASTER, STORED, Caller
from analytics.fitting import CostFit, TokenProfile
from lending.flow import (
    UNPRICED_COST_MS,
    key_share_header,
    queue_entry,
    relayed_key_share,
    tenant_of,
)


@dataclass
class FakeImage:
    units: int


@dataclass
class FakeJob:
    lane: str
    stream: bool = False
    lendable: bool = True
    model_id: str = "A"
    body: bytes = b"x" * 400
    max_tokens: int | None = 16
    image: FakeImage | None = None
    cached_prompt_bytes: int = 0
    cfg: Any = None


def node(
    profile: TokenProfile | None, *, fair_share: bool = False, fit: CostFit | None = None
) -> Any:
    costs = SimpleNamespace(
        tokens={"A": profile} if profile is not None else {},
        models={("A", "llm"): fit} if fit is not None else {},
    )
    lending = SimpleNamespace(
        clock=lambda: 12.5,
        costs=costs,
        settings=SimpleNamespace(context_reserve=0),
        fair_share=fair_share,
    )
    return SimpleNamespace(lending=lending)


PROFILE = TokenProfile(conservative_bytes_per_token=4.0, reserved_output_tokens=16.0, samples=9)


@pytest.mark.parametrize(
    ("stream", "lendable", "pinned"),
    [(False, True, False), (True, True, True), (False, False, True), (True, False, True)],
)
def test_a_stream_or_an_unlendable_path_is_pinned(
    stream: bool, lendable: bool, pinned: bool
) -> None:
    text = queue_entry(node(PROFILE), FakeJob("text", stream=stream, lendable=lendable))  # type: ignore[arg-type]
    unsized = queue_entry(node(None), FakeJob("text", stream=stream, lendable=lendable))  # type: ignore[arg-type]
    image = queue_entry(
        node(None),
        FakeJob("image", stream=stream, lendable=lendable, image=FakeImage(512 * 512 * 20)),  # type: ignore[arg-type]
    )

    assert (text.pinned, unsized.pinned, image.pinned) == (pinned, pinned, pinned)
    assert text.work == (100.0, 16.0)
    assert unsized.work == ()
    assert image.work == (float(512 * 512 * 20),)
    assert text.arrived_at == 12.5


def test_the_prompt_prefix_the_owner_holds_in_cache_is_its_cached_work() -> None:
    # 300 of the body's 400 bytes are cached: three quarters of its 100 prompt tokens.
    entry = queue_entry(node(PROFILE), FakeJob("text", cached_prompt_bytes=300))  # type: ignore[arg-type]
    whole = queue_entry(node(PROFILE), FakeJob("text", cached_prompt_bytes=4000))  # type: ignore[arg-type]
    none = queue_entry(node(PROFILE), FakeJob("text"))  # type: ignore[arg-type]

    assert entry.work == (100.0, 16.0)
    assert entry.cached == (75.0, 0.0)
    assert whole.cached == (100.0, 0.0)
    assert none.cached == ()


# ----- fair share ----------------------------------------------------------------------------

# 10 ms a request plus 1 ms a prompt token and 2 ms an output token.
FIT = CostFit(base_ms=10.0, slopes_ms=(1.0, 2.0), samples=20)


def test_with_fair_share_a_request_costs_its_fits_price_and_goes_up_to_parallel() -> None:
    job = FakeJob("text", cfg=SimpleNamespace(parallel=3))
    entry = queue_entry(node(PROFILE, fair_share=True, fit=FIT), job)  # type: ignore[arg-type]
    # 10 + 100 prompt tokens x 1 + 16 output tokens x 2.
    assert (entry.cost, entry.depth) == (142.0, 3)


def test_an_unpriced_request_costs_about_one_job_and_no_parallel_means_one() -> None:
    job = FakeJob("text", cfg=SimpleNamespace(parallel=None))
    entry = queue_entry(node(None, fair_share=True, fit=FIT), job)  # type: ignore[arg-type]
    assert (entry.cost, entry.depth) == (UNPRICED_COST_MS, 1)


def test_without_fair_share_the_entry_keeps_the_lanes_depth_and_unit_cost() -> None:
    job = FakeJob("text", cfg=SimpleNamespace(parallel=3))
    entry = queue_entry(node(PROFILE, fit=FIT), job)  # type: ignore[arg-type]
    assert (entry.cost, entry.depth) == (1.0, 0)


@dataclass
class FakeCtx:
    """What lending reads of a request (proxy/request.py's Ctx): `key_name` is the caller's,
    or on a node-protocol call the relaying node's word."""

    borrowed: bool = False
    scope: dict[str, Any] | None = None
    headers: dict[bytes, bytes] | None = None
    key_name: str | None = None

    def header(self, name: bytes) -> bytes | None:
        return (self.headers or {}).get(name)


def test_a_request_waits_under_its_stored_key_and_that_keys_share() -> None:
    caller = Caller(kind=STORED, name="team a", share=3.0)
    ctx = FakeCtx(scope={CALLER_SCOPE_KEY: caller}, key_name="team a")
    assert tenant_of(ctx) == ("team a", 3.0)  # type: ignore[arg-type]
    assert key_share_header(ctx) == {"X-Router-Key-Share": "3.0"}  # type: ignore[arg-type]
    # A client's own share header counts for nothing on a request that was not lent.
    spoof = FakeCtx(scope={}, headers={b"x-router-key-share": b"9"})
    assert tenant_of(spoof) == ("", 1.0)  # type: ignore[arg-type]
    assert key_share_header(spoof) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "headers", "expected"),
    [
        ("team a", {b"x-router-key-share": b"3.0"}, ("team a", 3.0)),
        ("b", {b"x-router-key-share": b"nan"}, ("b", 1.0)),
        ("b", {b"x-router-key-share": b"-2"}, ("b", 1.0)),
        ("b", {b"x-router-key-share": b"\xff"}, ("b", 1.0)),
        ("x" * 500, {}, ("x" * 200, 1.0)),
        (None, {}, ("", 1.0)),
    ],
)
def test_a_borrowed_request_waits_under_its_owners_key_whatever_the_headers_hold(
    name: str | None, headers: dict[bytes, bytes], expected: tuple[str, float]
) -> None:
    ctx = FakeCtx(borrowed=True, scope={}, headers=headers, key_name=name)
    assert tenant_of(ctx) == expected  # type: ignore[arg-type]


def test_the_master_passes_the_owners_share_on_as_it_came() -> None:
    ctx = FakeCtx(headers={b"x-router-key-share": b"3.0", b"x": b"y"})
    assert relayed_key_share(ctx) == "3.0"  # type: ignore[arg-type]
    assert relayed_key_share(FakeCtx(headers={})) is None  # type: ignore[arg-type]


def test_a_request_the_master_passed_on_waits_under_the_key_and_share_it_sent() -> None:
    master = Caller(kind=MASTER)
    ctx = FakeCtx(
        scope={CALLER_SCOPE_KEY: master},
        headers={b"x-router-key-share": b"2.5"},
        key_name="team a",
    )
    assert tenant_of(ctx) == ("team a", 2.5)  # type: ignore[arg-type]
