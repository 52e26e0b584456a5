"""The service time recorded for cost fits excludes waiting (exact numbers, patched clock)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from proxy.forwarding import local
from proxy.runtimes.backends import Launch


def test_a_job_that_waited_behind_another_in_a_one_slot_backend_counts_only_its_own_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = SimpleNamespace(last_done=0.0)
    launch = Launch(None, "", "models", family="sim")
    clock = iter([10.4, 10.6])
    monkeypatch.setattr(local.time, "monotonic", lambda: next(clock))
    # Both sent at t=10.0; the first finishes at 10.4, the second (waiting inside) at 10.6.
    assert local._service_ms(runtime, launch, 10.0) == pytest.approx(400.0)
    assert local._service_ms(runtime, launch, 10.0) == pytest.approx(200.0)
    assert runtime.last_done == 10.6


def test_a_concurrent_upstream_counts_from_the_send(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = SimpleNamespace(last_done=10.5)
    launch = Launch(None, "", "models", family="upstream")
    monkeypatch.setattr(local.time, "monotonic", lambda: 10.6)
    assert local._service_ms(runtime, launch, 10.0) == pytest.approx(600.0)
