"""The chaos soak's lending mode: links between the slaves' models, and what was lent.

Each slave's own model lends to the other slave's (which loads it if it must), and each
replica of the shared model lends to the other replica: both slaves are owners and helpers at
once, so every fault on a slave is a fault on a helper. The lending settings make the master
price pairs after a few samples and probe an idle helper quickly, so lending starts within the
first minute rather than after the production warm-up.
"""

from __future__ import annotations

import collections
from typing import Any

import httpx

from tests.harness import Cluster

# Pushed by the master to every slave (the lending settings), for a soak of minutes.
MASTER_LENDING = {
    "scheduling_refresh_interval": "1s",
    "scheduling_min_samples": "3",
    "offload_probe_idle": "200ms",
    "offload_probe_helper_slots": 2,
}
# Both ways: a save replaces every link touching its anchor, so each pair is one save.
LINKS = (("s1", "solo1", "s2", "solo2"), ("s1", "twin", "s2", "twin"))
DECISIONS = "/router/v1/site/offload/decisions"


def link(cluster: Cluster) -> list[str]:
    """Make the links through the master's site API; what could not be linked, as lines."""
    problems = []
    with cluster.master.client(timeout=30) as client:
        for owner, model, helper, helper_model in LINKS:
            other = {"node_id": helper, "model_id": helper_model, "load_if_unloaded": True}
            body = {
                "anchor": {"node_id": owner, "model_id": model},
                "lends_to": [other],
                "borrows_from": [other],
                "acknowledge_different_weights": True,
            }
            r = client.post("/router/v1/site/text-routing-groups", json=body)
            if r.status_code != 200:
                problems.append(f"link {owner}/{model} - {helper}/{helper_model}: {r.text[:200]}")
        # The helper's model loaded: a helper that must switch first is probed only after
        # 12 x offload_probe_idle of idleness.
        r = client.post("/router/v1/load", json={"model": "solo2"})
        if r.status_code != 200:
            problems.append(f"load solo2: {r.text[:200]}")
    return problems


def lending_counts(cluster: Cluster, since_ms: int) -> dict[str, Any]:
    """Decision-log rows since the soak began, by outcome, and the request IDs lent.

    The master gathers the rows from every node; a node that does not answer is named in
    `node_errors`, and rows a SIGKILLed node had not yet written are not there, so these are
    lower bounds.
    """
    base = {"limit": "5000", "since_ms": str(since_ms)}
    try:
        with cluster.master.client(timeout=60) as client:
            doc = client.get(DECISIONS, params=base).json()
            lent = client.get(DECISIONS, params={**base, "outcome": "lent"}).json()
            refused = client.get(DECISIONS, params={**base, "outcome": "relay_refused"}).json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": repr(exc), "lent_requests": 0, "lent_ids": set(), "stalled_ids": set()}
    outcomes: collections.Counter[str] = collections.Counter()
    for row in doc.get("records", []):
        outcomes[f"{row.get('kind')}/{row.get('outcome')}/{row.get('reason')}"] += 1
    lent_ids = {str(r["request_id"]) for r in lent.get("records", []) if r.get("request_id")}
    # Taken back from a helper that stopped answering: its backend may have run them already.
    stalled_ids = {
        str(r["request_id"])
        for r in refused.get("records", [])
        if r.get("request_id") and r.get("reason") == "helper_stalled"
    }
    return {
        # The newest 5000 rows (the route's cap) by outcome; `lent_requests` counts them all.
        "outcomes": dict(outcomes.most_common()),
        "lent_requests": len(lent_ids),
        "lent_ids": lent_ids,
        "stalled_ids": stalled_ids,
        "node_errors": [
            *doc.get("node_errors", []),
            *lent.get("node_errors", []),
            *refused.get("node_errors", []),
        ],
    }
