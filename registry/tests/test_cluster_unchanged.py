"""A poll or registration that repeats what the master holds costs no rebuild of the view."""

from __future__ import annotations

from typing import Any

from registry.cluster import ClusterState

SLAVE = "http://127.0.0.1:9"


def snapshot(*, disabled: bool = False, build: str = "1") -> dict[str, Any]:
    model: dict[str, Any] = {"local_id": "solo", "model_hash": "a" * 64, "config_hash": "b" * 64}
    model["disabled"] = disabled
    return {
        "node_id": "s1",
        "node_url": SLAVE,
        "models": [model],
        "protocol_version": 2,
        "build_version": build,
    }


def state() -> ClusterState:
    return ClusterState(
        role="master",
        node_id="master",
        public_url="http://127.0.0.1:8",
        slave_urls=[SLAVE],
        local_records=list,
        local_configs=dict,
    )


def test_a_repeated_snapshot_keeps_the_view_and_refreshes_the_node() -> None:
    cluster = state()
    told: list[tuple[str, bool]] = []
    cluster.health_listeners.append(lambda node_id, healthy: told.append((node_id, healthy)))
    first = cluster.apply_poll(SLAVE, snapshot())
    revision, view, taken_at = cluster.revision, cluster.view, first.accepted_at
    again = cluster.apply_poll(SLAVE, snapshot())
    assert cluster.revision == revision
    assert cluster.view is view
    assert again is first
    assert again.accepted_at >= taken_at
    # Listeners hear every poll's outcome, a repeated one too.
    assert told == [("s1", True), ("s1", True)]
    assert cluster.register(snapshot()) is first
    assert cluster.revision == revision


def test_a_changed_snapshot_or_a_node_back_from_failing_rebuilds() -> None:
    cluster = state()
    cluster.apply_poll(SLAVE, snapshot())
    revision = cluster.revision
    cluster.apply_poll(SLAVE, snapshot(disabled=True))
    assert cluster.revision == revision + 1
    assert cluster.by_public_id["solo"][0].record["disabled"] is True
    cluster.apply_poll(SLAVE, snapshot(disabled=True, build="2"))
    assert cluster.revision == revision + 2
    assert cluster.nodes["s1"].build_version == "2"
    cluster.mark_unhealthy(SLAVE, "timeout", suspect=True)
    assert cluster.by_public_id["solo"][0].available is False
    revision = cluster.revision
    cluster.apply_poll(SLAVE, snapshot(disabled=True, build="2"))
    assert cluster.revision == revision + 1
    assert cluster.by_public_id["solo"][0].available is True
    assert (cluster.nodes["s1"].healthy, cluster.nodes["s1"].suspect) == (True, False)
