"""Usage per key on a real three-node cluster: owner o (big, slow) lends to helper h (fast).

The traffic is sent once, by the module fixture, and every test reads it: counts hold whatever
order the tests run in. Until stored keys reach the front door, a request carries a key name
the way a master forwarding it does: on the node protocol, with the cluster token
(`X-Router-Key-Name`); a client sending that header on a client path names nothing.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest

from tests.harness import CLUSTER_TOKEN, Cluster, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
KEY_HEADER = "X-Router-Key-Name"
INNER_CHAT = "/router/v1/node/inference/v1/chat/completions"
ALICE = "alice ünïcode/1"  # any name an operator may type survives the header
ALICE_REQUESTS = 10
BOB_REQUESTS = 1
ANONYMOUS_REQUESTS = 3
TOTAL = ALICE_REQUESTS + BOB_REQUESTS + ANONYMOUS_REQUESTS


@dataclass
class Sent:
    cluster: Cluster
    since_ms: int


def chat(model: str, max_tokens: int = 10) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "how many tokens"}],
        "max_tokens": max_tokens,
    }


def alice_burst(c: Cluster) -> None:
    """`ALICE_REQUESTS` at once at the owner, as the master forwards a keyed request to it."""
    statuses: list[int] = []

    def call() -> None:
        with c.slaves["o"].client(timeout=120) as client:
            headers = {**AUTH, KEY_HEADER: quote(ALICE, safe="")}
            statuses.append(client.post(INNER_CHAT, json=chat("big"), headers=headers).status_code)

    threads = [threading.Thread(target=call) for _ in range(ALICE_REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * ALICE_REQUESTS


def send_traffic(c: Cluster) -> None:
    alice_burst(c)
    with c.slaves["h"].client(timeout=120) as client:
        headers = {**AUTH, KEY_HEADER: "bob"}
        assert client.post(INNER_CHAT, json=chat("fast"), headers=headers).status_code == 200
    # A client cannot name a key: on a client path the header is nobody's word.
    for node in (c.master, c.master, c.slaves["o"]):
        with node.client(timeout=120) as client:
            eve = {KEY_HEADER: "eve"}
            assert client.post("/v1/chat/completions", json=chat("big"), headers=eve).is_success


@pytest.fixture(scope="module")
def sent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sent]:
    c = start_cluster(
        tmp_path_factory.mktemp("usage"),
        [],
        {
            "o": [text_model("big", load_ms=50, base_ms=5, output_ms_per_token=40)],
            "h": [text_model("fast", load_ms=50, base_ms=5, output_ms_per_token=2)],
        },
        master_sections={
            "cluster": {"offload_probe_idle": "100ms", "offload_probe_helper_slots": 2}
        },
    )
    try:
        with c.master.client() as client:
            link = {
                "anchor": {"node_id": "o", "model_id": "big"},
                "lends_to": [{"node_id": "h", "model_id": "fast"}],
                "acknowledge_different_weights": True,
            }
            assert client.post("/router/v1/site/text-routing-groups", json=link).status_code == 200
            assert client.post("/router/v1/load", json={"model": "fast"}).status_code == 200
        since_ms = int(time.time() * 1000)
        send_traffic(c)
        yield Sent(c, since_ms)
    finally:
        c.cleanup()


def usage(sent: Sent, group_by: str, **params: str) -> list[dict[str, Any]]:
    with sent.cluster.master.client() as client:
        resp = client.get(
            "/router/v1/site/usage",
            params={"since_ms": str(sent.since_ms), "group_by": group_by, **params},
        )
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["node_errors"] == []
    rows: list[dict[str, Any]] = doc["rows"]
    return rows


def settled(sent: Sent, group_by: str) -> list[dict[str, Any]]:
    """The rows once every request is in: a helper writes its row as its answer leaves."""
    seen: list[list[dict[str, Any]]] = []

    def complete() -> bool:
        seen.append(usage(sent, group_by))
        return sum(r["requests"] for r in seen[-1]) >= TOTAL

    wait_for(complete, timeout=15, interval=0.2)
    return seen[-1]


MEASURES = {"requests", "errors", "prompt_tokens", "completion_tokens", "backend_ms", "lent"}


def test_each_request_counts_once_and_a_lent_one_on_its_helper_under_the_owners_key(
    sent: Sent,
) -> None:
    rows = settled(sent, "key,node")
    assert all(set(r) == {"key_name", "node_id"} | MEASURES for r in rows)
    assert sum(r["requests"] for r in rows) == TOTAL
    by = {(r["key_name"], r["node_id"]): r for r in rows}
    assert sum(r["requests"] for (key, _), r in by.items() if key == ALICE) == ALICE_REQUESTS
    assert sum(r["requests"] for (key, _), r in by.items() if key == "bob") == BOB_REQUESTS
    assert sum(r["requests"] for (key, _), r in by.items() if key is None) == ANONYMOUS_REQUESTS
    assert not any(key == "eve" for key, _ in by), "a client header named a key"
    # Lent requests ran on the helper, which counts them under alice's key; the owner kept
    # no row of its own for them, or the total above would be more than was sent.
    lent_to_h = by[(ALICE, "h")]["lent"]
    assert lent_to_h >= 1, "nothing was lent"
    kept = by[(ALICE, "o")]["requests"] if (ALICE, "o") in by else 0
    assert kept + lent_to_h == ALICE_REQUESTS
    assert all(r["lent"] == 0 for (_, node), r in by.items() if node != "h")
    assert all(r["errors"] == 0 and r["prompt_tokens"] > 0 for r in rows)
    assert all(r["completion_tokens"] > 0 and r["backend_ms"] > 0 for r in rows)


def test_every_grouping_adds_up_to_the_same_totals(sent: Sent) -> None:
    whole = settled(sent, "key")
    totals = {m: sum(r[m] for r in whole) for m in MEASURES - {"backend_ms"}}
    for group_by, fields in (
        ("model", {"model"}),
        ("node", {"node_id"}),
        ("day", {"day"}),
        ("model,day,key,node", {"model", "day", "key_name", "node_id"}),
    ):
        rows = usage(sent, group_by)
        assert all(set(r) == fields | MEASURES for r in rows), group_by
        assert {m: sum(r[m] for r in rows) for m in totals} == totals, group_by
    models = {r["model"]: r for r in usage(sent, "model")}
    # Public IDs: the owner's model and the helper's, which answered the lent ones as well.
    assert set(models) == {"big", "fast"}
    assert models["fast"]["lent"] == totals["lent"]
    today = datetime.now(UTC).date().isoformat()
    days = {r["day"] for r in usage(sent, "day")}
    assert days <= {today, (datetime.fromtimestamp(sent.since_ms / 1000, UTC).date().isoformat())}


def test_a_range_that_ends_before_the_traffic_has_no_rows(sent: Sent) -> None:
    before = {"since_ms": str(sent.since_ms - 600_000), "until_ms": str(sent.since_ms - 1)}
    assert usage(sent, "key", **before) == []


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"group_by": "user"}, "group_by"),
        ({"group_by": "key,,day"}, "group_by"),
        ({"since_ms": "yesterday"}, "since_ms"),
        ({"until_ms": "1.5"}, "until_ms"),
        ({"since_ms": "20", "until_ms": "10"}, "since_ms"),
    ],
)
def test_a_bad_query_is_a_400_naming_the_parameter(
    sent: Sent, params: dict[str, str], param: str
) -> None:
    with sent.cluster.master.client() as client:
        resp = client.get("/router/v1/site/usage", params=params)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["param"], error["type"]) == (param, "invalid_request_error")
    assert param in error["message"]


def metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


def test_metrics_count_requests_and_tokens_per_key_on_the_serving_node(sent: Sent) -> None:
    rows = settled(sent, "key,node")
    on_h = {r["key_name"]: r for r in rows if r["node_id"] == "h"}
    with sent.cluster.slaves["h"].client() as client:
        text = client.get("/metrics").text
    alice = on_h[ALICE]
    assert metric(text, "router_key_requests_total", key=ALICE, outcome="ok") == alice["requests"]
    assert metric(text, "router_key_requests_total", key=ALICE, outcome="error") == 0
    assert (
        metric(text, "router_key_tokens_total", key=ALICE, direction="in")
        == (alice["prompt_tokens"])
    )
    assert (
        metric(text, "router_key_tokens_total", key=ALICE, direction="out")
        == (alice["completion_tokens"])
    )
    assert metric(text, "router_key_requests_total", key="bob", outcome="ok") == 1
    with sent.cluster.slaves["o"].client() as client:
        owner = client.get("/metrics").text
    # Requests without a stored key count under the empty key (on o, or on h when lent).
    keyless = [metric(t, "router_key_requests_total", key="", outcome="ok") for t in (owner, text)]
    assert sum(keyless) == ANONYMOUS_REQUESTS


def test_a_slave_has_neither_the_usage_route_nor_the_pages(sent: Sent) -> None:
    # The master answers for the cluster; a slave answers only its node-protocol part.
    with sent.cluster.slaves["o"].client() as client:
        for path in ("/router/v1/site/usage", "/ui/usage", "/ui/keys"):
            assert client.get(path).status_code == 404, path
        own = client.get("/router/v1/node/usage", params={"group_by": "node"}, headers=AUTH)
    assert own.status_code == 200
    assert [r["node_id"] for r in own.json()["rows"]] == ["o"]
