"""What a request enters the router queue as: its size estimate, and whether it may be lent."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from analytics.fitting import TokenProfile
from lending.flow import queue_entry


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


def node(profile: TokenProfile | None) -> Any:
    costs = SimpleNamespace(tokens={"A": profile} if profile is not None else {})
    lending = SimpleNamespace(
        clock=lambda: 12.5, costs=costs, settings=SimpleNamespace(context_reserve=0)
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
