"""A slave whose master cannot push it the key table (every push refused) still follows it:
its own pull takes a new key and a revocation within 5 s while it reaches the master.

The slave refuses the pushes with its own front door: its `server.max_body_bytes` is smaller
than the table, so every push gets 413, while the slave's pull reads the table as an answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.harness import Cluster, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration

KEYS = "/router/v1/site/api-keys"
TAKES_EFFECT_SECS = 5.0
# Smaller than a table of one key (its name, hash and fields): every push is refused.
SLAVE_MAX_BODY_BYTES = 200
LONG_NAME = "a-key-whose-name-outgrows-the-slaves-body-limit"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    made = start_cluster(
        tmp_path_factory.mktemp("keys-pull"),
        [text_model("alpha")],
        {"s1": [text_model("beta")]},
        per_slave_sections={"s1": {"server": {"max_body_bytes": SLAVE_MAX_BODY_BYTES}}},
    )
    try:
        yield made
    finally:
        made.cleanup()


def status_on_slave(cluster: Cluster, secret: str) -> int:
    with cluster.slaves["s1"].client() as c:
        return c.get("/v1/models", headers={"Authorization": f"Bearer {secret}"}).status_code


def test_a_slave_refusing_every_push_still_follows_new_and_revoked_keys(cluster: Cluster) -> None:
    started = time.monotonic()
    with cluster.master.client() as c:
        # A second key keeps the table too big to push once the first is revoked.
        assert c.post(KEYS, json={"name": LONG_NAME + "-stays"}).status_code == 201
        made = c.post(KEYS, json={"name": LONG_NAME})
    assert made.status_code == 201, made.text
    secret = made.json()["key"]
    wait_for(lambda: status_on_slave(cluster, secret) == 200, timeout=TAKES_EFFECT_SECS)
    assert time.monotonic() - started <= TAKES_EFFECT_SECS
    # The push really failed: the master said so (once) in its log.
    wait_for(lambda: "push of the key table to s1 failed" in cluster.master.output(), timeout=5)
    assert "413" in cluster.master.output()

    started = time.monotonic()
    with cluster.master.client() as c:
        revoked = c.delete(f"{KEYS}/{made.json()['id']}")
    assert revoked.status_code == 200
    assert revoked.json()["node_errors"][0]["node_id"] == "s1"
    wait_for(lambda: status_on_slave(cluster, secret) == 401, timeout=TAKES_EFFECT_SECS)
    assert time.monotonic() - started <= TAKES_EFFECT_SECS
