"""The lending runtime's wiring of a live lease into its lane queues."""

from __future__ import annotations

from pathlib import Path

import yaml

from analytics.costs import NodeCosts
from lending.owner import LiveLease
from lending.planner import Lease
from lending.queue import Entry, LaneQueue
from lending.runtime import Lending
from proxy.node import build_node
from routerproject.config import load_config


def lending(live: set[tuple[str, str]] | None) -> Lending:
    runtime = Lending(node_id="o", file_values={"scheduling_backend_depth": "1"}, clock=lambda: 0.0)
    if live is not None:
        runtime.lease_live = lambda lane, model_id: (lane, model_id) in live
    return runtime


def after_running(queue: LaneQueue) -> list[Entry]:
    """One job running, then a lendable request and a stream: which goes in next?"""
    running = Entry("A", 0.0)
    queue.enqueue(running)
    plain, stream = Entry("A", 1.0), Entry("A", 2.0, pinned=True)
    queue.enqueue(plain)
    queue.enqueue(stream)
    assert queue.complete(running) in ([plain], [stream])
    return [entry for entry in (plain, stream) if entry in queue.admitted()]


def test_under_a_live_lease_a_stream_goes_before_an_earlier_lendable_request() -> None:
    runtime = lending({("text", "A")})

    (admitted,) = after_running(runtime.queue("text"))

    assert admitted.pinned


def test_a_lease_on_another_lane_leaves_arrival_order() -> None:
    runtime = lending({("text", "A")})

    (admitted,) = after_running(runtime.queue("image"))

    assert not admitted.pinned


def test_a_lease_taken_after_the_queue_was_made_still_puts_streams_first() -> None:
    live: set[tuple[str, str]] = set()
    runtime = lending(live)
    queue = runtime.queue("text")
    (before,) = after_running(queue)
    queue.complete(before)
    queue.complete(queue.admitted()[0])
    live.add(("text", "A"))

    (admitted,) = after_running(queue)

    assert not before.pinned
    assert admitted.pinned


def test_without_a_lease_check_streams_keep_their_place() -> None:
    (admitted,) = after_running(lending(None).queue("text"))

    assert not admitted.pinned


def test_a_nodes_queue_puts_streams_first_while_its_owner_holds_a_live_lease(
    tmp_path: Path,
) -> None:
    config_path = tmp_path / "config.yaml"
    (tmp_path / "kcpps").mkdir()
    cluster = {"node_id": "o", "store_dir": str(tmp_path / "store")}
    raw = {"cluster": cluster, "models": {"config_dir": str(tmp_path / "kcpps")}}
    config_path.write_text(yaml.safe_dump({**raw, "backend": {"mode": "sim"}}))
    node = build_node(load_config(config_path, environ={}))
    try:
        node.lending.apply_settings({"scheduling_backend_depth": "1"}, source="test")
        lease = Lease(
            lane="text",
            owner_node_id="o",
            owner_model_id="A",
            helper_node_id="h",
            helper_model_id="B",
            load_helper_model=False,
            restore_helper_model=False,
            helper_slots=1,
            probe=False,
            ttl_ms=30_000,
            owner_job_ms=None,
            helper_switch_ms=None,
            helper_service_ms=None,
        )
        now = node.lending.clock()
        node.owner.leases[("text", "A")] = LiveLease(lease, expires_at=now + 60.0)
        queue = node.lending.queue("text")

        (admitted,) = after_running(queue)
        assert admitted.pinned

        queue.complete(admitted)
        queue.complete(queue.admitted()[0])
        node.owner.leases[("text", "A")] = LiveLease(lease, expires_at=now - 1.0)

        (admitted,) = after_running(queue)
        assert not admitted.pinned
    finally:
        node.restore.close()


def test_waiting_requests_are_counted_per_lane_model_and_key() -> None:
    lend = Lending(node_id="n", file_values={}, clock=lambda: 5.0, fair_share=True)
    assert lend.is_queued("text", "unlinked")
    queue = lend.queue("text")
    for tenant in ("a", "a", "", "b", "a"):
        queue.enqueue(Entry("m", 5.0, tenant=tenant, depth=1))
    # The first one runs; the other four wait.
    assert lend.waiting_by_key() == [
        {"lane": "text", "model_id": "m", "key": None, "waiting": 1},
        {"lane": "text", "model_id": "m", "key": "a", "waiting": 2},
        {"lane": "text", "model_id": "m", "key": "b", "waiting": 1},
    ]
    assert not Lending(node_id="n", file_values={}).is_queued("text", "unlinked")


def fitted(loads: dict[str, float]) -> NodeCosts:
    return NodeCosts(models={}, loads=loads, tokens={}, computed_at=0.0)


def test_a_load_just_measured_is_the_expected_time_until_the_costs_know_the_config() -> None:
    lend = Lending(node_id="n", file_values={})
    assert lend.expected_load_ms("a.kcpps") is None
    lend.load_measured("a.kcpps", 1200.0, success=True)
    assert lend.expected_load_ms("a.kcpps") == 1200.0
    # Refitted costs without the config yet (the rows were not flushed): still the measurement.
    lend.costs = fitted({"b.kcpps": 300.0})
    assert lend.expected_load_ms("a.kcpps") == 1200.0
    assert lend.expected_load_ms("b.kcpps") == 300.0
    # Once the costs have the config, their mean over the window wins over the last load.
    lend.costs = fitted({"a.kcpps": 1000.0})
    lend.load_measured("a.kcpps", 5000.0, success=True)
    assert lend.expected_load_ms("a.kcpps") == 1000.0


def test_a_failed_or_empty_load_is_no_expected_time() -> None:
    lend = Lending(node_id="n", file_values={})
    lend.load_measured("a.kcpps", 900.0, success=False)
    lend.load_measured("b.kcpps", 0.0, success=True)
    lend.load_measured("", 900.0, success=True)
    assert lend.measured_loads_ms == {}
